#!/usr/bin/env bash
# kparity in this repository's CI. Each subcommand is one step of .github/workflows/kparity.yml
# (kparity's examples/ci/github-actions.yml), and runs the same way by hand:
#
#   bash ci/kparity.sh install   a venv with kparity (from its checkout, locked by its
#                                constraints.txt), pytest and this repository
#   bash ci/kparity.sh gate      pull requests: pytest's kparity gate (commit tier), `kparity
#                                check` of this repository's impls, and `kparity compare` of
#                                that check against the last nightly's
#   bash ci/kparity.sh nightly   schedule: `kparity nightly` (nightly tier; bench where a GPU
#                                is; compare against the history; the HTML report) into the
#                                persistent store, then `kparity compare` of tonight's runs
#                                against last night's
#
# Environment [default]:
#   KPARITY_STORE      the nightly's result store: a folder that outlives the job [nightly:
#                      required; gate: compared against where it exists, never written]
#   KPARITY_OUT        what the steps write: site/ (the report), compare-*.md, JUnit and JSON
#                      files, the gate's store [kparity-out]
#   KPARITY_VENV       the venv that install makes and the other steps activate [.venv]
#   KPARITY_SRC        kparity's checkout, for install [kparity]
#   KPARITY_IMPLS      the impl ids to check, comma-separated [my_kernels.kparity_plugin.IMPLS]
#   KPARITY_FILTERS    more selection flags for check and nightly, e.g. "--preset qwen3-8b" []
#   KPARITY_BASELINE   runs of history for nightly's compare and the report [10]
#   KPARITY_ALLOW_CPU  1: `pytest -m gpu` runs on a CPU too (tests/conftest.py) [unset]
#   GITHUB_STEP_SUMMARY  set by GitHub Actions: the compare tables are appended to it
#
# Exit status: 0 green; 1 a failing check or a regression; 2 bad input; 3 no accelerator for
# `pytest -m gpu` (kparity's own codes).
set -euo pipefail

OUT=${KPARITY_OUT:-kparity-out}
VENV=${KPARITY_VENV:-.venv}
SRC=${KPARITY_SRC:-kparity}
FILTERS=${KPARITY_FILTERS:-}
BASELINE=${KPARITY_BASELINE:-10}

say() { echo "== kparity.sh: $*"; }

activate() {
    # shellcheck disable=SC1091
    . "$VENV/bin/activate"
}

impls() {
    if [ -n "${KPARITY_IMPLS:-}" ]; then
        echo "$KPARITY_IMPLS"
    else
        python -c 'import my_kernels.kparity_plugin as p; print(",".join(i.id for i in p.IMPLS))'
    fi
}

summary() {  # a compare's markdown file, into the job's summary page
    if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
        cat "$1" >> "$GITHUB_STEP_SUMMARY"
    fi
}

# `kparity compare A B --format markdown` into $OUT/compare-NAME.md; exit 1 on a regression.
compare_runs() {
    local name=$1 a=$2 b=$3 store=$4 rc=0
    kparity --store "$store" compare "$a" "$b" --format markdown > "$OUT/compare-$name.md" \
        || rc=$?
    cat "$OUT/compare-$name.md"
    summary "$OUT/compare-$name.md"
    return "$rc"
}

cmd_install() {
    python3 -m venv "$VENV"
    activate
    python -m pip install -c "$SRC/constraints.txt" -e "$SRC[torch,history]" pytest -e .
    kparity ops  # "1 from plugins": pyproject.toml's entry point is found
}

cmd_gate() {
    activate
    mkdir -p "$OUT"
    local ids
    ids=$(impls)
    say "pytest's gate (commit tier) over $ids"
    python -m pytest -m gpu --tier commit tests --junit-xml "$OUT/pytest.xml"

    # The check writes to a copy of the nightly store: the last nightly's rows are there to
    # compare with, and a pull request's run never enters the nightly history.
    rm -rf "$OUT/store"
    local nightly=""
    if [ -n "${KPARITY_STORE:-}" ] && [ -d "$KPARITY_STORE" ]; then
        cp -r "$KPARITY_STORE" "$OUT/store"
        nightly=yes
    fi
    say "kparity check (commit tier) of $ids"
    # shellcheck disable=SC2086  # FILTERS: flags, split on spaces
    kparity --store "$OUT/store" check --impl "$ids" --tier commit $FILTERS \
        --json "$OUT/check.json" --junit-xml "$OUT/check.xml"

    if [ -z "$nightly" ]; then
        say "no nightly store (KPARITY_STORE) to compare with" | tee "$OUT/compare-nightly.md"
        return 0
    fi
    say "kparity compare: this check against the last nightly's"
    local rc=0
    # default runs: B the newest (this check), A the last run of this device kind with rows
    # of the same cases (the nightly's check)
    kparity --store "$OUT/store" compare --impl "$ids" --format markdown \
        > "$OUT/compare-nightly.md" || rc=$?
    cat "$OUT/compare-nightly.md"
    if [ "$rc" = 2 ]; then  # as `kparity nightly` takes it: no comparable run, not a failure
        say "no nightly run of this device kind to compare with" | tee -a "$OUT/compare-nightly.md"
        rc=0
    fi
    summary "$OUT/compare-nightly.md"
    return "$rc"
}

# "verb,run_id" of every check and bench run in the store, oldest first (run ids sort by start
# time; the CSV has a header line and CRLF line ends).
store_runs() {
    kparity --store "$KPARITY_STORE" sql \
        "SELECT verb, run_id FROM runs WHERE verb IN ('check', 'bench') ORDER BY run_id" \
        --format csv | tail -n +2 | tr -d '\r'
}

cmd_nightly() {
    : "${KPARITY_STORE:?set KPARITY_STORE to a folder that outlives the job (the history)}"
    activate
    mkdir -p "$OUT"
    local ids status=0
    ids=$(impls)
    say "kparity nightly (nightly tier) of $ids into $KPARITY_STORE"
    # check, bench (on an accelerator), compare each run against its last $BASELINE runs,
    # report; exit 1 on a failing check or a regression. The report is written either way.
    # shellcheck disable=SC2086  # FILTERS: flags, split on spaces
    kparity --store "$KPARITY_STORE" nightly --impl "$ids" --tier nightly $FILTERS \
        --baseline "$BASELINE" --out "$OUT/site" || status=$?
    if [ "$status" = 2 ] || [ "$status" = 3 ]; then
        return "$status"  # bad input, or nothing could run: no runs to compare
    fi

    local verb all runs
    all=$(store_runs)
    for verb in check bench; do
        mapfile -t runs < <(grep "^$verb," <<< "$all" | cut -d, -f2 | tail -n 2)
        if [ "${#runs[@]}" -lt 2 ]; then
            say "compare $verb: no earlier nightly $verb run in $KPARITY_STORE" \
                | tee "$OUT/compare-$verb.md"
            continue
        fi
        say "kparity compare: tonight's $verb run against last night's"
        compare_runs "$verb" "${runs[0]}" "${runs[1]}" "$KPARITY_STORE" || status=$?
    done
    return "$status"
}

case "${1:-}" in
    install) cmd_install ;;
    gate) cmd_gate ;;
    nightly) cmd_nightly ;;
    *) echo "usage: bash ci/kparity.sh install|gate|nightly (see the comments at its top)" >&2
       exit 2 ;;
esac
