"""Test selection by git change: `kparity check --since REF`, `pytest --kparity-since REF`.

The files changed since REF (`git diff --name-only REF`: committed, staged and unstaged
changes, plus untracked files) select the impls whose results they can change. What an impl
depends on is read from the code, never declared:

* its own module (the module of `impl.run`) and everything that module imports within this
  repo's packages (oracle, cases, gpu_impls, runners, results, models, verbs), transitively:
  module-level and in-function `import`s read with `ast` (a module's parent packages'
  `__init__.py` included, as Python runs them);
* the CUDA sources its modules name: a string literal equal to the name of a file in
  `gpu_impls/cuda/kernels/` (`SOURCE = "kp_rms_norm.cu"`), and the headers those files
  `#include "x.cuh"`, transitively (a module naming several kernels: all its impls take them);
* its op: the modules of the OpSpec's functions (oracle, tolerance, kernel model...) and of
  the op's case sources (`cases/registry.py`), with their imports; a pipeline's stage ops;
* a staged impl's stage impls, an exact-peer impl's peer.

What a changed file selects, first rule that applies:

1. `runners/`, `results/`, `models/`, `verbs/`: everything (core: the machinery every check
   runs through).
2. A file every impl of this repo depends on, or one the runners import: core (everything)
   (`oracle/spec.py`, `oracle/numerics.py`, `gpu_impls/impl.py`, `cases/model.py`; and
   `oracle/comparators.py`, `oracle/metrics.py`, `cases/generate.py`, which every check runs
   through).
3. A file some impl depends on: the impls that depend on it (`oracle/norms.py`: the rms_norm
   family's ops and their impls; `kernels/kp_rms_norm.cu`: the `cuda:kp_*` norms).
4. Docs and what runs no check (`*.md`, `*.rst`, `benchmarks/`, `tests/`, `scripts/`,
   `examples/`, `reference/`, `docs/`, `.github/`, LICENSE, .gitignore): nothing.
5. A file under `gpu_impls/BACKEND/` that no impl's graph reaches (its `backend.py`, timers,
   `known_issues.json`, a kernel no module names): every impl of that backend.
6. Anything else (`gpu_impls/staged.py`, `pyproject.toml`, a deleted file, an unknown file):
   core (everything): a file that cannot be attributed is assumed to matter to all.

An impl whose module lies outside this repo (a plugin's) is selected by a core change and by
a change to its op's oracle or cases; changes to its own code are not seen here.
"""

from __future__ import annotations

import ast
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from gpu_impls import BACKENDS
from runners.limits import BadInput

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("oracle", "cases", "gpu_impls", "runners", "results", "models", "verbs")
CORE_DIRS = ("runners/", "results/", "models/", "verbs/")
INERT_DIRS = ("benchmarks/", "tests/", "scripts/", "examples/", "reference/", "docs/",
              ".github/")
INERT_SUFFIXES = (".md", ".rst")
INERT_NAMES = ("LICENSE", ".gitignore")
KERNEL_DIR = "gpu_impls/cuda/kernels"
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


class SinceError(BadInput):
    """A bad ref, or no git checkout: the CLI prints it, exit 2."""


@dataclass(frozen=True)
class Reason:
    """What one changed file selects: `kind` core (everything), backend (every impl of one),
    impls (those named, `ops`: the ops whose oracle or cases it is part of) or nothing."""

    path: str
    kind: str
    impls: frozenset[str] = frozenset()
    ops: tuple[str, ...] = ()
    note: str = ""


@dataclass
class Selection:
    ref: str
    changed_files: list[str]
    impl_ids: set[str]
    reasons: list[Reason]
    core_changed: list[str] = field(default_factory=list)
    impl_ops: dict[str, str] = field(default_factory=dict)  # every impl considered -> its op

    def lines(self, among=None, limit: int = 12) -> list[str]:
        """What was selected and why: a headline, then a line per changed file (at most
        `limit`, the rest counted); one line where nothing is. `among`: the impl ids the other
        filters (--op, --backend...) left, which the counts and names are of."""
        universe = set(self.impl_ops if among is None else among)
        shown = self.impl_ids & universe
        n = len(self.changed_files)
        files = f"{n} {'file' if n == 1 else 'files'} changed"
        if not n:
            return [f"since {self.ref}: no file changed: nothing selected"]
        if not shown:
            what = ", ".join(self.changed_files[:3]) + (f" +{n - 3} more" if n > 3 else "")
            why = ("none of them can change a result" if not self.impl_ids
                   else "none affects the impls the other filters leave")
            return [f"since {self.ref}: {files} ({what}); {why}: nothing selected"]
        ops = {self.impl_ops[i] for i in shown}
        out = [f"since {self.ref}: {files}; " + ("core changed, " if self.core_changed else "")
               + f"selected {len(ops)} {_plural(len(ops), 'op')}, {len(shown)} "
               + f"{_plural(len(shown), 'impl')}:"]
        for r in self.reasons[:limit]:
            hit = r.impls & universe
            if r.kind == "core":
                what = f"everything ({r.note})"
            elif r.kind == "nothing":
                what = f"nothing ({r.note})"
            elif r.kind == "backend":
                what = f"{r.note}: {len(hit)} {_plural(len(hit), 'impl')}"
            else:
                by_op = {i for i in hit if self.impl_ops[i] in r.ops}
                here = {self.impl_ops[i] for i in hit}  # the ops selected here first
                r_ops = sorted(r.ops, key=lambda op: (op not in here, op))
                parts = [f"ops {_names(r_ops, sort=False)}"] if r.ops else []
                if hit - by_op:
                    parts.append(_names(hit - by_op))
                what = "; ".join(parts) + (f" ({len(hit)} {_plural(len(hit), 'impl')}"
                                           + (" here" if among is not None else "") + ")"
                                           if r.ops else "")
                if not hit:  # all outside what --op/--backend/... leave
                    what = (f"ops {_names(r.ops)}" if r.ops else _names(r.impls)) \
                        + " (none among the impls the other filters leave)"
            out.append(f"  {r.path} -> {what}")
        if len(self.reasons) > limit:
            out.append(f"  ... and {len(self.reasons) - limit} more files")
        return out


def _plural(n: int, word: str) -> str:
    return word if n == 1 else word + "s"


# --- git -----------------------------------------------------------------------------------------

def _git(root: Path, *args: str, flag: str = "--since") -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    except FileNotFoundError:
        raise SinceError(f"{flag}: git is not installed here, and {flag} needs it\n"
                         f"  install git, or leave {flag} out") from None


def changed_files(ref: str, root: Path = ROOT, flag: str = "--since") -> list[str]:
    """Paths (relative to `root`) changed between `ref` and the working tree, untracked files
    included; renames count as both names. `flag`: the option errors name."""
    top = _git(root, "rev-parse", "--show-toplevel", flag=flag)
    if top.returncode:
        said = (top.stderr.strip().splitlines() or ["git failed"])[-1]
        raise SinceError(f"{flag} {ref}: {root} is not a git checkout ({said})\n"
                         f"  run from a git clone of the project, or leave {flag} out")
    if _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").returncode:
        raise SinceError(f"{flag} {ref}: no such commit in the git checkout {root}\n"
                         "  give a commit, branch or tag it has (HEAD~3, main, a sha); a shallow "
                         "CI clone may need `git fetch --deepen N` first")
    diff = _git(root, "diff", "--name-only", "--no-renames", "--relative", ref, "--")
    if diff.returncode:
        raise SinceError(f"{flag} {ref}: git diff failed: {diff.stderr.strip()}\n"
                         "  check the ref and the checkout")
    others = _git(root, "ls-files", "--others", "--exclude-standard")
    return sorted({p for p in (diff.stdout + others.stdout).splitlines() if p.strip()})


# --- the dependency graph ------------------------------------------------------------------------

class Graph:
    """Repo files and what each depends on (python imports, kernel names and #includes)."""

    def __init__(self, root: Path = ROOT):
        self.root = root
        self._direct: dict[str, set[str]] = {}
        kdir = root / KERNEL_DIR
        self.kernels = {p.name for p in kdir.iterdir() if p.is_file()} if kdir.is_dir() else set()

    def rel(self, path) -> str | None:
        """`path` relative to the root, or None where it lies outside."""
        try:
            return Path(path).resolve().relative_to(self.root).as_posix()
        except ValueError:
            return None

    def module_files(self, name: str) -> list[str]:
        """The files importing `name` runs within this repo: each package's __init__.py down to
        the module. Empty for modules outside PACKAGES."""
        parts = name.split(".")
        if parts[0] not in PACKAGES:
            return []
        out = []
        for i in range(1, len(parts) + 1):
            base = self.root.joinpath(*parts[:i])
            for candidate in (base / "__init__.py", base.with_suffix(".py")):
                if candidate.is_file():
                    out.append(candidate.relative_to(self.root).as_posix())
                    break
            else:
                break
        return out

    def _is_module(self, name: str) -> bool:
        base = self.root.joinpath(*name.split("."))
        return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()

    def direct(self, rel: str) -> set[str]:
        if rel not in self._direct:
            self._direct[rel] = self._read(rel)
        return self._direct[rel]

    def _read(self, rel: str) -> set[str]:
        path = self.root / rel
        if not path.is_file():
            return set()
        if rel.startswith(KERNEL_DIR + "/"):
            text = path.read_text(errors="replace")
            return {f"{KERNEL_DIR}/{m}" for m in _INCLUDE.findall(text) if m in self.kernels}
        if not rel.endswith(".py"):
            return set()
        try:
            tree = ast.parse(path.read_text(errors="replace"), rel)
        except SyntaxError:
            return set()
        package = rel[:-3].replace("/", ".")
        if not rel.endswith("__init__.py"):
            package = package.rpartition(".")[0]
        else:
            package = package[: -len(".__init__")]
        deps: set[str] = set()
        names_kernels = rel.startswith("gpu_impls/")
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    deps.update(self.module_files(alias.name))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    up = up[: len(up) - (node.level - 1)] if node.level > 1 else up
                    base = ".".join(p for p in (*up, base) if p)
                deps.update(self.module_files(base))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if self._is_module(sub):
                        deps.update(self.module_files(sub))
            elif _imports_literal(node):  # importlib.import_module("oracle.norms")
                deps.update(self.module_files(node.args[0].value))
            elif names_kernels and isinstance(node, ast.Constant) \
                    and isinstance(node.value, str) and node.value in self.kernels:
                deps.add(f"{KERNEL_DIR}/{node.value}")
        deps.discard(rel)
        return deps

    def closure(self, files) -> frozenset[str]:
        """`files` and everything they depend on, transitively."""
        out: set[str] = set()
        todo = list(files)
        while todo:
            f = todo.pop()
            if f in out:
                continue
            out.add(f)
            todo.extend(self.direct(f) - out)
        return frozenset(out)

    def of_module(self, name: str | None) -> frozenset[str]:
        """The closure of module `name` (a repo module or a file of a plugin in the repo)."""
        import sys

        if not name:
            return frozenset()
        files = self.module_files(name)
        if not files:  # outside PACKAGES: its file, where the repo holds it
            mod = sys.modules.get(name)
            rel = self.rel(mod.__file__) if getattr(mod, "__file__", None) else None
            files = [rel] if rel else []
        return self.closure(files)


def _imports_literal(node) -> bool:
    """Whether `node` is a call `import_module("a.literal.name")`."""
    return (isinstance(node, ast.Call) and bool(node.args)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))


def _module_of(fn) -> str | None:
    fn = getattr(fn, "func", fn)  # functools.partial
    return getattr(fn, "__module__", None)


def op_deps(graph: Graph) -> dict[str, frozenset[str]]:
    """{op name: the files its oracle, bounds and cases depend on}."""
    import oracle
    from cases.registry import bench_sources, sources
    from oracle.spec import registry

    oracle.load_all()
    gate, bench = sources(), bench_sources()
    specs = registry()
    out: dict[str, frozenset[str]] = {}

    def deps(name: str, seen=()) -> frozenset[str]:
        if name in out:
            return out[name]
        spec = specs.get(name)
        files: set[str] = set()
        if spec is not None:
            for attr in ("oracle", "tolerance", "bytes", "flops", "kernel", "make_inputs",
                         "plant", "loss", "domain"):
                fn = getattr(spec, attr, None)
                if callable(fn):
                    files |= graph.of_module(_module_of(fn))
            pipeline = getattr(spec, "pipeline", None)
            for stage in getattr(pipeline, "stages", ()) or ():
                if stage.op not in seen:
                    files |= deps(stage.op, (*seen, name))
        for src in (gate.get(name), bench.get(name)):
            if src is not None:
                files |= graph.of_module(_module_of(src))
        out[name] = frozenset(files)
        return out[name]

    for name in specs:
        deps(name)
    return out


def impl_deps(graph: Graph, impls: dict) -> tuple[dict[str, frozenset[str]], set[str]]:
    """({impl id: the files its own code depends on}, the ids whose module is outside the
    repo). Staged impls take their stages', exact peers their peer's."""
    own: dict[str, frozenset[str]] = {}
    outside = set()
    for impl_id, impl in impls.items():
        files = graph.of_module(_module_of(impl.run))
        if not files:
            outside.add(impl_id)
        own[impl_id] = files
    full = dict(own)
    for impl_id, impl in impls.items():
        linked = list((impl.stages or {}).values())
        if impl.exact_peer is not None:
            linked.append(impl.exact_peer.peer)
        for other in linked:
            full[impl_id] = full[impl_id] | own.get(other, frozenset())
    return full, outside


# --- the selection -------------------------------------------------------------------------------

def _inert(path: str) -> bool:
    return (path.startswith(INERT_DIRS) or path.endswith(INERT_SUFFIXES)
            or Path(path).name in INERT_NAMES)


def _names(ids, limit: int = 6, sort: bool = True) -> str:
    ids = sorted(ids) if sort else list(ids)
    more = f" (+{len(ids) - limit} more)" if len(ids) > limit else ""
    return ", ".join(ids[:limit]) + more


def classify(changed: list[str], impls: dict, ref: str = "?", root: Path = ROOT) -> Selection:
    """The selection that `changed` (paths relative to `root`) makes among `impls`
    (id -> Impl), by the rules of the module docstring."""
    graph = Graph(root)
    ops = op_deps(graph)
    own, outside = impl_deps(graph, impls)
    full = {i: own[i] | ops.get(impls[i].op, frozenset()) for i in impls}
    inside = [i for i in impls if i not in outside]
    everyone = frozenset.intersection(*(full[i] for i in inside)) if inside else frozenset()
    machinery = graph.closure(p.relative_to(root).as_posix()
                              for p in sorted((root / "runners").glob("**/*.py")))

    reasons: list[Reason] = []
    everything = frozenset(impls)
    for path in changed:
        hit = frozenset(i for i in impls if path in full[i])
        if path.startswith(CORE_DIRS):
            reasons.append(Reason(path, "core", everything,
                                  note=f"core: {path.split('/')[0]}/ runs every check"))
        elif path in everyone or path in machinery:
            who = "every impl depends on it" if path in everyone else "the runners import it"
            reasons.append(Reason(path, "core", everything, note=f"core: {who}"))
        elif hit:
            hit_ops = tuple(sorted(o for o, files in ops.items() if path in files))
            reasons.append(Reason(path, "impls", hit, hit_ops))
        elif _inert(path):
            reasons.append(Reason(path, "nothing", note="cannot change a result"))
        elif path.startswith("gpu_impls/") and path.split("/")[1] in BACKENDS:
            backend = path.split("/")[1]
            mine = frozenset(i for i, impl in impls.items() if impl.backend == backend)
            reasons.append(Reason(path, "backend", mine,
                                  note=f"every {backend} impl (no impl's imports reach it)"))
        else:
            gone = "deleted, " if not (root / path).exists() else ""
            reasons.append(Reason(path, "core", everything,
                                  note=f"core: {gone}not attributable to an op or impl"))
    selected = set().union(*(r.impls for r in reasons)) if reasons else set()
    order = {"core": 0, "backend": 1, "impls": 2, "nothing": 3}
    reasons.sort(key=lambda r: (order[r.kind], r.path))
    return Selection(ref, list(changed), selected, reasons,
                     [r.path for r in reasons if r.kind == "core"],
                     {i: impl.op for i, impl in impls.items()})


def select_since(ref: str, impls: dict | None = None, root: Path = ROOT,
                 changed: list[str] | None = None, flag: str = "--since") -> Selection:
    """The impls (default: every registered one) whose results the changes since git ref
    `ref` can affect. `changed`: the changed paths, instead of asking git (tests); `flag`:
    the option a bad ref's error names."""
    if impls is None:
        import gpu_impls

        impls = gpu_impls.impls()
    if changed is None:
        changed = changed_files(ref, root, flag)
    return classify(changed, impls, ref, root)
