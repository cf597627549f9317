#!/usr/bin/env bash
# The newest releases of every dependency, tested: the nightly job beside the locked CI.
#
#   bash scripts/newest.sh            # a venv in .venv-newest, newest releases, the tests,
#                                     # then what moved against constraints.txt
#   bash scripts/newest.sh --write    # the same, then constraints.txt rewritten from it
#   SKIP_TESTS=1 bash scripts/newest.sh   # only resolve and say what moved
#
# The README's setup installs from constraints.txt, so an upstream release cannot turn main red;
# this script is how the project learns about one on purpose. Exit: the tests' status (0 green).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-newest}
EXTRAS='.[torch,mlx-cpu,history,model,test,ray]'

rm -rf "$VENV"
python3 -m venv "$VENV"
. "$VENV/bin/activate"
# no -c: each dependency at its newest release within pyproject.toml's ranges
pip install -q --upgrade -e "$EXTRAS" -e examples/kparity-example-plugin
pip freeze | grep -v -e '^-e' -e '^#' -e '^kparity' | sed 's/^\(torch==[^+]*\)+.*/\1/' \
    | sort -f > "$VENV/freeze.txt"

echo "what moved against constraints.txt (locked -> newest):"
python3 - "$VENV/freeze.txt" <<'EOF'
import re
import sys

def pins(path):
    out = {}
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[re.sub(r"[-_.]+", "-", name).lower()] = version
    return out

locked, newest = pins("constraints.txt"), pins(sys.argv[1])
moved = [(n, locked.get(n, "-"), newest.get(n, "-")) for n in sorted(set(locked) | set(newest))
         if locked.get(n) != newest.get(n)]
for name, old, new in moved:
    print(f"  {name:28s} {old:>14s} -> {new}")
print(f"  {len(moved)} of {len(newest)} moved" if moved else "  nothing moved")
EOF

status=0
if [ -z "${SKIP_TESTS:-}" ]; then
  python -m pytest -q -n auto || status=$?
fi
if [ "${1:-}" = "--write" ]; then
  { sed -n '/^#/p' constraints.txt; cat "$VENV/freeze.txt"; } > constraints.txt.new
  mv constraints.txt.new constraints.txt
  echo "constraints.txt rewritten from the newest releases"
fi
exit $status
