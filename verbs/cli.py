"""kparity: differential correctness and benchmarking of LLM-inference GPU kernels against
NumPy oracles. Every check and timing is a row in a Parquet store.

Global options (--store, --plugin) go before or after the verb: `kparity --store DIR check`
and `kparity check --store DIR` are the same. Plugins register more ops and impls (a kernel
repo's own): `--plugin MODULE` (a dotted module importable from here, or a .py file; one that
fails to load is exit 2), and every `kparity.plugins` entry point installed (one that fails is
a warning; the rest runs). The store is .kparity/ here unless --store or $KPARITY_STORE.

Exit codes: 0 success, 1 a check failed (or a regression), 2 bad input (an unknown name lists
the valid ones, closest first), 3 nothing could run (no backend here for what was asked),
130 interrupted (Ctrl-C: the rows so far are kept; `check --resume last` runs the rest), 143
terminated (SIGTERM: the same).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import pkgutil
import re
import sys
import textwrap
import time

from rich.markup import escape

import verbs
from cases.casefile import CaseFileError, closest
from gpu_impls import known_issues
from results.store import StoreError
from runners.limits import BadInput, DeviceUnusable
from verbs import console as verbs_console
from verbs.stops import sigterm_interrupts, stop_kind
from verbs.console import console
from verbs.usage import LINE, UsageError


def verb_modules() -> list:
    """The verb modules of this package, found rather than listed: every module of `verbs`
    that defines `add_parsers(sub)` (its subparsers) and `VERBS` ({verb: function}), in their
    `ORDER` (the sections of the help above). Each is imported here, so a verb module keeps its
    heavy imports (DuckDB, plotly) inside its verb functions: `kparity --help` stays fast."""
    found = []
    for info in pkgutil.iter_modules(verbs.__path__):
        if info.name == "cli" or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"verbs.{info.name}")
        if hasattr(module, "add_parsers") and hasattr(module, "VERBS"):
            found.append(module)
    return sorted(found, key=lambda m: (getattr(m, "ORDER", len(found)), m.__name__))


def verb_table() -> dict:
    """{verb name: its function}, read from the verb modules at each call (a test may swap one
    entry of a module's VERBS)."""
    return {name: fn for module in verb_modules() for name, fn in module.VERBS.items()}


# --- parser ------------------------------------------------------------------------------------

class Parser(argparse.ArgumentParser):
    """argparse's parser (every verb's too: subparsers take their parent's class) with its
    errors in two lines, as every bad input is: what was wrong (an invalid choice with the
    closest few valid ones, not all), then where the options are (not the whole usage)."""

    def error(self, message: str):
        found = re.match(r"(argument .+: invalid choice: )'(.*)' \(choose from (.*)\)$", message)
        if found:
            head = f"{self.prog}: error: {found.group(1)}{found.group(2)!r}; valid: "
            choices = [c.strip("'") for c in found.group(3).split(", ")]
            message = (f"{found.group(1)}{found.group(2)!r}; valid: "
                       + closest(found.group(2), choices, width=LINE - len(head)))
        self.exit(2, f"{self.prog}: error: {message}\n  `{self.prog} --help` lists "
                     f"{'its options' if ' ' in self.prog else 'the verbs and options'}\n")


def _global_options(p: argparse.ArgumentParser, after_verb: bool) -> None:
    """--store and --plugin, on the top-level parser and (after_verb) on every verb's. A verb's
    parser fills its own namespace, which then overwrites the top level's: after the verb they
    have no default (SUPPRESS), so an option given only before the verb survives, and --plugin
    lands in `plugin_after`, which `parse_args` appends to the plugins given before the verb."""
    default = argparse.SUPPRESS if after_verb else None
    p.add_argument("--store", default=default, metavar="DIR",
                   help="result store (default: .kparity here, or $KPARITY_STORE)")
    p.add_argument("--plugin", action="append", default=default, metavar="MODULE",
                   dest="plugin_after" if after_verb else "plugin",
                   help="load a plugin first: a dotted module importable from here "
                        "(tests.mutants) or a .py file (tests/mutants.py) that registers ops "
                        "or impls; repeatable. Installed `kparity.plugins` entry points load "
                        "without it")


def parser() -> argparse.ArgumentParser:
    """The CLI's parser. Its help (this module's docstring) lists the verbs after its first
    paragraph, grouped, from the verb modules themselves (`verb_list`), once: argparse's own
    list of the subparsers is left out (help=SUPPRESS), so a registered verb is never missing."""
    p = Parser(prog="kparity", usage="%(prog)s [-h] [--store DIR] [--plugin MODULE] VERB ...",
               formatter_class=argparse.RawDescriptionHelpFormatter)
    _global_options(p, after_verb=False)
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB", help=argparse.SUPPRESS,
                           prog="kparity")  # each verb's prog: "kparity VERB"
    modules = verb_modules()
    for module in modules:
        module.add_parsers(sub)
    for verb_parser in sub.choices.values():
        _global_options(verb_parser, after_verb=True)
    intro, rest = __doc__.split("\n\n", 1)
    p.description = f"{intro}\n\n{verb_list(sub, modules)}\n\n{rest}"
    return p


def verb_list(sub, modules: list) -> str:
    """The verbs as `kparity --help` lists them: under each module's GROUP (in ORDER), each
    verb and its help (the one its module gave `add_parser`), wrapped to 92 columns."""
    helps = {action.dest: action.help for action in sub._choices_actions}
    lines, heading = ["Verbs (`kparity VERB --help` for each):"], None
    for module in modules:
        group = getattr(module, "GROUP", "more")
        for verb in module.VERBS:
            label = group if group != heading else ""
            heading = group
            text = textwrap.wrap(helps.get(verb) or "", 92 - 28) or [""]
            lines.append(f"  {label:<15}{verb:<10}  {text[0]}")
            lines += [" " * 29 + more for more in text[1:]]
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    """The parsed command line, --plugin values from before and after the verb together."""
    args = parser().parse_args(argv)
    args.plugin = (args.plugin or []) + vars(args).pop("plugin_after", []) or None
    return args


def main(argv=None) -> int:
    verbs_console.COMMAND_STARTED = time.monotonic()
    args = parse_args(argv)
    try:
        with plugin_warnings_in_yellow(), sigterm_interrupts():
            load_plugins(args.plugin or [])
            return verb_table()[args.verb](args)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM in a verb without a line of its own
        how, code = stop_kind(e)
        console.print(f"[yellow]{how}[/]: what it wrote to the store before stays there")
        return code
    except (UsageError, BadInput) as e:
        console.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)
        return 2
    except (StoreError, CaseFileError, known_issues.KnownIssueError) as e:
        console.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)
        return 2
    except DeviceUnusable as e:  # rows so far are in the store; --resume runs the rest
        console.print(f"[red]stopped:[/] {escape(str(e))}", soft_wrap=True)
        return 1


def load_plugins(modules: list[str]) -> None:
    """The --plugin modules, in order; one that fails to load is bad input (exit 2)."""
    import gpu_impls

    for module in modules:
        try:
            gpu_impls.load_plugin(module)
        except gpu_impls.PluginError as e:
            hint = ("\n  --plugin takes a module importable from here (tests.mutants) or a .py "
                    "file (tests/mutants.py)"
                    if isinstance(e.__cause__, (ImportError, OSError)) else "")
            raise UsageError(f"{e}{hint}") from None


@contextlib.contextmanager
def plugin_warnings_in_yellow():
    """An entry-point plugin that failed to load (`gpu_impls.PluginWarning`, warned wherever
    impls are first listed) as one yellow line each; other warnings as Python shows them."""
    import warnings

    import gpu_impls

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, gpu_impls.PluginWarning):
            console.print(f"[yellow]plugin not loaded:[/] {escape(str(message))}",
                          soft_wrap=True)
        else:
            show_other(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():  # restores the filters and showwarning on the way out
        warnings.simplefilter("always", gpu_impls.PluginWarning)
        show_other, warnings.showwarning = warnings.showwarning, show
        yield


if __name__ == "__main__":
    # `python -m verbs.cli`: run the imported module's main, so there is one verbs.cli (the one
    # a composite verb such as nightly imports to run the others), not __main__'s copy beside it
    from verbs.cli import main as imported_main

    sys.exit(imported_main())
