"""kparity runners: correctness, the sweep, and the `kparity` CLI."""
