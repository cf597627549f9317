"""The ledger of known bugs: which (impl, case) pairs fail for a tracked reason, and which must
never launch. After FlashInfer's fuzz ledger (`tests/test_helpers/fuzz_ledger.py`).

Entries live next to the impls, one JSON list per backend package
(`gpu_impls/<backend>/known_issues.json`); a plugin adds its own with `register`. An entry:

    {"impl": "cuda:mt_rms_norm", "case": {"dtype": "bf16", "dims.n": "409[5-7]"},
     "issue": "thewafflehaus/FFAI#123", "class": "xfail", "why": "one line"}

- `impl`: an impl id, or a glob over ids (`cuda:*`).
- `case`: globs (`fnmatch`, on the value as text) over case fields: `id`, `op`, `dtype`, `dist`,
  `label`, `dims.<name>`, `params.<name>`. Every field given must match; `{}` matches every case.
- `issue`: where the bug is tracked: `#<number>` (with an optional `repo` or `owner/repo`
  before it) or a URL. An entry without one is refused: a known failure is a tracked failure or none.
- `class`:
  - `xfail`: the case runs; a failure is recorded `xfail` (not failing the sweep, its original
    status and message kept), a pass `xpass`, which fails the sweep: the bug is fixed or the
    entry is too wide, so the entry must go (a stale entry hides the next regression);
  - `never-launch`: the case is recorded `quarantined` and never runs (a crash class that
    poisons the device, a hang).
A `never-launch` entry matching a case wins over any `xfail` one (a hang must not launch because
a broader xfail also matches); otherwise the first matching entry wins. The ledger applies to
valid cases only: a violating case never launches anyway. A malformed entry (a dims or params
name no op has included) is an error naming the file, the entry's index and the field, before
anything runs.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

CLASSES = ("xfail", "never-launch")
CASE_FIELDS = ("id", "op", "dtype", "dist", "label")
ISSUE_REF = re.compile(r"^(([\w.-]+(/[\w.-]+)?)?#\d+|https?://\S+)$")


class KnownIssueError(ValueError):
    """A malformed ledger entry: bad input, exit 2."""


@dataclass(frozen=True)
class KnownIssue:
    impl: str
    issue: str
    kind: str  # one of CLASSES
    case: Mapping[str, str] = field(default_factory=dict)
    why: str = ""
    source: str = ""  # the file (or plugin) it came from, for messages

    def matches(self, impl_id: str, case) -> bool:
        return fnmatch.fnmatchcase(impl_id, self.impl) and all(
            _field_matches(case, key, pattern) for key, pattern in self.case.items())

    def describe(self) -> str:
        return f"known issue {self.issue} ({self.kind}{': ' + self.why if self.why else ''})"


def _field_matches(case, key: str, pattern: str) -> bool:
    """The glob on the field's text; a number against a number-valued param compares as
    numbers (`"1e-6"` matches eps = 1e-06)."""
    if key in CASE_FIELDS:
        return fnmatch.fnmatchcase(str(getattr(case, key)), pattern)
    group, _, name = key.partition(".")
    values = case.dims if group == "dims" else case.params
    if name not in values:
        return False
    value = values[name]
    if group == "params" and isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(pattern) == float(value)
        except ValueError:
            pass
    return fnmatch.fnmatchcase(str(value), pattern)


def _names(group: str, op: str | None) -> set[str]:
    """Every dims (or params) name of `op`, or of any op."""
    from oracle.spec import registry

    specs = [s for name, s in registry().items() if op is None or name == op]
    return {n for s in specs for n in (s.dims if group == "dims" else s.params)}


def parse(entry, where: str) -> KnownIssue:
    """One entry (a JSON object) checked field by field; `where` names it in errors."""
    if not isinstance(entry, dict):
        raise KnownIssueError(f"{where}: expected an object with impl, case, issue, class")
    unknown = sorted(set(entry) - {"impl", "case", "issue", "class", "why"})
    if unknown:
        raise KnownIssueError(f"{where}: unknown field(s) {', '.join(unknown)}; valid: impl, "
                              "case, issue, class, why")
    for key in ("impl", "issue", "class"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise KnownIssueError(f"{where}: field {key!r} is missing or not a string")
    if not isinstance(entry.get("why", ""), str):
        raise KnownIssueError(f"{where}: field 'why' must be a string")
    if entry["class"] not in CLASSES:
        raise KnownIssueError(f"{where}: class {entry['class']!r}; valid: {', '.join(CLASSES)}")
    if not ISSUE_REF.match(entry["issue"]):
        raise KnownIssueError(f"{where}: issue {entry['issue']!r} is no tracked reference; give "
                              "'#123', 'repo#123', 'owner/repo#123' or a URL")
    case = entry.get("case", {})
    if not isinstance(case, dict):
        raise KnownIssueError(f"{where}: field 'case' must be an object of field globs")
    for key, pattern in case.items():
        group, dot, name = key.partition(".")
        if not (key in CASE_FIELDS or (dot and group in ("dims", "params") and name)):
            raise KnownIssueError(f"{where}: case field {key!r}; valid: "
                                  f"{', '.join(CASE_FIELDS)}, dims.<name>, params.<name>")
        if key not in CASE_FIELDS:
            op = case.get("op") if "*" not in case.get("op", "*") else None
            valid = _names(group, op)
            if name not in valid:  # a typo here would silently match nothing
                raise KnownIssueError(
                    f"{where}: case field {key!r}: no {group} {name!r} in "
                    f"{'op ' + op if op else 'any op'}; valid: {', '.join(sorted(valid))}")
        if not isinstance(pattern, str):
            raise KnownIssueError(f"{where}: case field {key!r} must be a string glob")
    return KnownIssue(entry["impl"], entry["issue"], entry["class"], dict(case),
                      entry.get("why", ""), where)


def load_file(path: Path) -> list[KnownIssue]:
    try:
        entries = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise KnownIssueError(f"{path}: not JSON ({e})") from None
    if not isinstance(entries, list):
        raise KnownIssueError(f"{path}: expected a JSON list of entries")
    return [parse(e, f"{path} entry {i}") for i, e in enumerate(entries)]


_REGISTERED: list[KnownIssue] = []


def register(*entries: dict, source: str = "plugin") -> None:
    """Add entries (dicts in the file format) from a plugin."""
    _REGISTERED.extend(parse(e, f"{source} entry {i}") for i, e in enumerate(entries))


def ledger() -> list[KnownIssue]:
    """Every backend package's `known_issues.json`, then the registered entries."""
    root = Path(__file__).parent
    entries = []
    for path in sorted(root.glob("*/known_issues.json")):
        entries += load_file(path)
    return entries + _REGISTERED


def find(impl_id: str, case, entries: list[KnownIssue]) -> KnownIssue | None:
    """The entry for (impl, case): a matching never-launch entry first, else the first match."""
    hits = [e for e in entries if e.matches(impl_id, case)]
    return next((e for e in hits if e.kind == "never-launch"), hits[0] if hits else None)


def unmatched(entries: list[KnownIssue], impl_ids) -> list[KnownIssue]:
    """Entries whose impl glob matches no registered impl (stale, or a typo)."""
    return [e for e in entries if not any(fnmatch.fnmatchcase(i, e.impl) for i in impl_ids)]

