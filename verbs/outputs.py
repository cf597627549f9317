"""Machine-readable results of `check` and `bench` for bots and CI: `--json FILE` and
`--junit-xml FILE`.

JSON: the run id, the verdict, counts, and one record per row (impl, case id, status, message,
key metrics, the command that reruns it); strict JSON, so a non-finite metric is a string
("inf", "-inf", "nan"). JUnit XML, as pytest and nvbench users' CI reads it:
one `<testcase>` per row (`check`: per (impl, case); `bench`: per (impl, case, mode)), classname
the impl id, name the case id and its short dims label, `time` the row's seconds; a failing row
has a `<failure>` with its message and repro line; a contract refusal of a violating case (the
expected outcome), an xfail and a quarantined case are `<skipped>`.

Both files are written once the run ends (write then rename: a reader never sees half a file).
Their directory is checked when the command line is parsed (`output_path`), so a typo fails
before the sweep starts, not after it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from cases.model import Case
from verbs.selection import global_flags, repro_line

CHECK_METRICS = ("budget", "max_abs", "max_rel", "nmse", "cosine", "max_ulp", "frac_within",
                 "nonfinite_mismatch", "worst_output")
BENCH_METRICS = ("median_ns", "min_ns", "q1_ns", "q3_ns", "rel_std", "n_samples", "n_dropped",
                 "stop_reason", "gbps", "tflops", "pct_copy_ceiling", "pct_copy_same",
                 "pct_peak_spec", "cache_resident", "correct", "budget")
# Outcomes that JUnit shows as skipped: nothing wrong, nothing measured against the oracle.
SKIPPED = {"rejected ok": "refused by its contract, as expected for a violating case",
           "xfail": "known issue (xfail)", "quarantined": "known issue, not launched"}


def output_path(text: str) -> Path:
    """argparse `type` of --json and --junit-xml: a file whose directory exists and is writable
    (checked before the run starts: a typo must not cost a sweep)."""
    path = Path(text)
    folder = path.parent
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file name in it")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: directory {folder} does not exist; create it "
                                         "or give a file in an existing one")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: directory {folder} is not writable")
    return path


def add_flags(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--json", type=output_path, default=None, metavar="FILE",
                   help=f"write the run id, the verdict, counts and one record per {what} "
                        "(status, message, key metrics, repro command) as JSON")
    p.add_argument("--junit-xml", type=output_path, default=None, metavar="FILE",
                   help=f"write JUnit XML: one testcase per {what}, failures with their repro "
                        "line (as pytest --junit-xml)")


def _finite(value):
    """`value` with every non-finite float as the string "inf", "-inf" or "nan": strict JSON has
    no Infinity or NaN (jq and JSON.parse reject them), and a budget of inf (an unwritten
    output) must not read as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _write_json(path: Path, doc: dict) -> None:
    _write_atomic(path, json.dumps(_finite(doc), indent=1, allow_nan=False, default=str) + "\n")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _prefix(args) -> str:
    """`kparity` with the global flags a rerun needs (its store and plugins)."""
    return "kparity" + global_flags(args)


def _short(row: dict) -> str:
    """The case's short label (op[dims] dtype dist) from its row."""
    if row.get("case_json"):
        return Case.from_json(row["case_json"]).short()
    return f"{row['op']}{row['dims']} {row['dtype']}"


def _dims(row: dict):
    return json.loads(row["dims"]) if row.get("dims") else None


def _suite(name: str, cases: list[ET.Element], run_id: str) -> ET.ElementTree:
    """<testsuites><testsuite> around the testcases, with their counts and total time."""
    counts = Counter(child.tag for case in cases for child in case
                     if child.tag in ("failure", "error", "skipped"))
    total = sum(float(c.get("time", "0")) for c in cases)
    attrs = {"name": name, "tests": str(len(cases)), "failures": str(counts["failure"]),
             "errors": str(counts["error"]), "skipped": str(counts["skipped"]),
             "time": f"{total:.3f}"}
    root = ET.Element("testsuites", attrs)
    suite = ET.SubElement(root, "testsuite", attrs)
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", {"name": "run_id", "value": run_id})
    suite.extend(cases)
    ET.indent(root)
    return ET.ElementTree(root)


def _testcase(impl: str, name: str, seconds) -> ET.Element:
    return ET.Element("testcase", {"classname": impl, "name": name,
                                   "time": f"{seconds or 0.0:.3f}"})


def _failure(case: ET.Element, kind: str, message: str, repro: str) -> None:
    failure = ET.SubElement(case, "failure", {"type": kind, "message": message})
    failure.text = f"{message}\nrepro: {repro}"


def _write_xml(path: Path, tree: ET.ElementTree) -> None:
    _write_atomic(path, ET.tostring(tree.getroot(), encoding="unicode", xml_declaration=True)
                  + "\n")


# --- check -------------------------------------------------------------------------------------

def check_repro(args, row: dict) -> str:
    return repro_line(args, row["case_id"], row["impl"])


def write_check(args, rows: list[dict], run_id: str | None = None) -> None:
    """--json / --junit-xml of a `check` run (nothing when neither flag was given)."""
    if not (getattr(args, "json", None) or getattr(args, "junit_xml", None)):
        return
    from runners.verdicts import is_failure, outcome

    run_id = run_id or (rows[0]["run_id"] if rows else getattr(args, "resume", "") or "")
    failing = [r for r in rows if is_failure(r)]
    if args.json:
        counts = Counter(outcome(r) for r in rows)
        doc = {"verb": "check", "run_id": run_id, "verdict": "FAILED" if failing else "OK",
               "counts": {"rows": len(rows), "failing": len(failing),
                          **dict(sorted(counts.items()))},
               "rows": [{"impl": r["impl"], "case_id": r["case_id"], "op": r["op"],
                         "dtype": r["dtype"], "dims": _dims(r), "label": r["label"],
                         "expect": r["expect"], "status": r["status"], "outcome": outcome(r),
                         "failing": is_failure(r), "message": r["message"],
                         "metrics": {k: r.get(k) for k in CHECK_METRICS},
                         "seconds": r.get("seconds"), "repro": check_repro(args, r)}
                        for r in rows]}
        _write_json(args.json, doc)
    if args.junit_xml:
        cases = []
        for r in rows:
            case = _testcase(r["impl"], f"{r['case_id']} {_short(r)}", r.get("seconds"))
            if is_failure(r):
                _failure(case, outcome(r), r["message"] or outcome(r), check_repro(args, r))
            elif outcome(r) in SKIPPED:
                ET.SubElement(case, "skipped", {"type": outcome(r), "message": (
                    f"{SKIPPED[outcome(r)]}: {r['message']}" if r["message"]
                    else SKIPPED[outcome(r)])})
            cases.append(case)
        _write_xml(args.junit_xml, _suite("kparity check", cases, run_id))


# --- bench -------------------------------------------------------------------------------------

def bench_repro(args, row: dict) -> str:
    preset = row["label"].split(":", 1)[-1]
    return (f"{_prefix(args)} bench --impl {row['impl']} --preset {preset} --dtype {row['dtype']} "
            f"--mode {row['mode']}")


def bench_failing(row: dict) -> bool:
    """A bench row that fails the run: wrong results (not timed) or an error."""
    return row["status"] in ("fail", "error")


def write_bench(args, rows: list[dict], run_id: str, notes: dict[int, str]) -> None:
    """--json / --junit-xml of a `bench` run. `notes[i]`: row i's shortfall of the noise target
    (`runners.stopping.shortfall`), "" when it converged."""
    if not (getattr(args, "json", None) or getattr(args, "junit_xml", None)):
        return
    failing = [r for r in rows if bench_failing(r)]
    if args.json:
        counts = Counter(r["status"] for r in rows)
        not_converged = sum(1 for i, r in enumerate(rows) if r["status"] == "ok" and notes.get(i))
        doc = {"verb": "bench", "run_id": run_id, "verdict": "FAILED" if failing else "OK",
               "max_noise": args.max_noise,
               "counts": {"rows": len(rows), "failing": len(failing),
                          "not_converged": not_converged, **dict(sorted(counts.items()))},
               "rows": [{"impl": r["impl"], "case_id": r["case_id"], "op": r["op"],
                         "dtype": r["dtype"], "dims": _dims(r), "label": r["label"],
                         "mode": r["mode"], "timer": r["timer"], "status": r["status"],
                         "converged": r["status"] == "ok" and not notes.get(i),
                         "note": notes.get(i, ""), "message": r["message"],
                         "metrics": {k: r.get(k) for k in BENCH_METRICS},
                         "seconds": r.get("seconds"), "repro": bench_repro(args, r)}
                        for i, r in enumerate(rows)]}
        _write_json(args.json, doc)
    if args.junit_xml:
        cases = []
        for i, r in enumerate(rows):
            case = _testcase(r["impl"], f"{r['case_id']} {_short(r)} {r['mode']}", r.get("seconds"))
            if bench_failing(r):
                _failure(case, r["status"], r["message"] or r["status"], bench_repro(args, r))
            elif r["status"] != "ok":  # refused by the contract: not measured
                ET.SubElement(case, "skipped", {"type": r["status"], "message": r["message"]})
            else:
                out = ET.SubElement(case, "system-out")
                noise = f"{100 * r['rel_std']:.3g} %" if r.get("rel_std") is not None else "-"
                out.text = (f"median {r['median_ns'] / 1e3:.3f} us, noise {noise}, "
                            f"n {r['n_samples']}, stop {r['stop_reason']}"
                            + (f"; {notes[i]}" if notes.get(i) else ""))
            cases.append(case)
        _write_xml(args.junit_xml, _suite("kparity bench", cases, run_id))
