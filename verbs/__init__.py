"""kparity verbs: the `kparity` CLI (verbs/cli.py) and one module per group of verbs."""
