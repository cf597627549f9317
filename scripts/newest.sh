#!/usr/bin/env bash
# The newest releases of every dependency, tested: the nightly job beside the locked CI.
#
#   bash scripts/newest.sh            # a venv in .venv-newest, newest releases, the tests,
#                                     # then what moved against constraints.txt
#   bash scripts/newest.sh --write    # the same, then constraints.txt rewritten from it
#   SKIP_TESTS=1 bash scripts/newest.sh   # only resolve and say what moved
#
# A pin in constraints.txt marked "# held: <why>" stays at its version on --write (the newest
# release is still installed and tested here, and shows as moved).
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
  # the header comments, then the newest pins, but a pin marked "# held: why" stays as it is
  python3 - "$VENV/freeze.txt" <<'EOF'
import re
import sys

def key(line):
    return re.sub(r"[-_.]+", "-", line.split("==", 1)[0].strip()).lower()

old = open("constraints.txt").read().splitlines()
held = {key(line): line for line in old if "# held:" in line and "==" in line}
lines = [line for line in old if line.startswith("#")]
lines += [held.get(key(line), line) for line in open(sys.argv[1]).read().splitlines()]
open("constraints.txt", "w").write("\n".join(lines) + "\n")
print("constraints.txt rewritten from the newest releases"
      + (f" (held: {', '.join(sorted(held))})" if held else ""))
EOF
fi
exit $status
