"""Pipelines: stages of registered ops wired output -> input, registered and run like an op.

A `Pipeline` names its stages in order; each `Stage` runs a registered op, and its `wires` say
where each of the op's inputs comes from: `"<stage>.<output>"` (an earlier stage's output) or a
pipeline input's name (default: the input's own name). `register_pipeline` registers it in the
op registry as an `OpSpec` (`OpSpec.pipeline` set), so `kparity check --op NAME`, the case
sources and the store treat it as any op:

    inputs   the stages' unwired inputs, under their pipeline names
    outputs  `outputs` ({name: "<stage>.<output>"}; default: the last stage's outputs)
    dims     the stages' dims (`Stage.dims` renames one or fixes it); params: the stage ops'
             params (a shared name is one value for every stage that has it)

The oracle is the exact composition as the kernels run it: each stage's oracle on the previous
stages' outputs *rounded to their dtype* (what a kernel stores and the next one loads), in
float64 between the stores:

    y_1 = T(o_1(x)),  y_k = T(o_k(y_{k-1}, ...)),  pipeline output = o_K(...) pre-store.

The end-to-end tolerance composes the stages' kernel models (`OpSpec.kernel`) in one interval
arithmetic (`oracle/numerics.py`): stage k's f32 value v_k +- e_k is stored in T; a kernel's
stored value lies in [RNE_T(v_k - e_k), RNE_T(v_k + e_k)] (rounding is monotone), so the next
stage reads an interval around the exact composition's y_k whose radius is the farther end
(`Bounds.stored`); the next kernel model carries it through its own arithmetic, exactly as it
carries its own roundings. The result bounds |chain of kernels - exact composition| for every
chain of admissible kernels, rigorously. A stage fed by another stage must read its inputs through
`A.load` (which passes an interval through); where a stage has no kernel model, or one that
cannot take an interval, the pipeline gives its own `tolerance(inputs, exact, case)`.

Checking (`runners/pipeline_check.py`): a staged impl (one impl per stage,
`gpu_impls/staged.py`) has each stage checked against its own op's oracle on the *previous
stage's kernel output* (so a wrong stage is named, and the stages after it are judged on what
they were actually given), and the chain against this op's oracle and bound. A fused impl is an
ordinary impl of the pipeline op: checked end to end.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

import numpy as np

from oracle.dtypes import round_to, storage_dtype
from oracle.spec import OpSpec, TensorSpec, get_op, register


@dataclass(frozen=True)
class Stage:
    """One stage: a registered op under a stage name. `wires`: the op's input -> its source,
    "<stage>.<output>" or a pipeline input's name (unwired inputs: a pipeline input of the same
    name). `dims`: the op's dim -> a pipeline dim's name, or a fixed int (default: same name).
    `params`: params fixed for this stage (over the case's)."""

    name: str
    op: str
    wires: Mapping[str, str] = field(default_factory=dict)
    dims: Mapping[str, str | int] = field(default_factory=dict)
    params: Mapping[str, object] = field(default_factory=dict)

    @property
    def spec(self) -> OpSpec:
        return get_op(self.op)


@dataclass(frozen=True)
class Pipeline:
    name: str
    family: str
    stages: tuple[Stage, ...]
    outputs: Mapping[str, str] | None = None  # pipeline output -> "<stage>.<output>"
    params: Mapping[str, object] = field(default_factory=dict)
    version: int = 1
    doc: str = ""
    # The end-to-end bound, where the stages' kernel models cannot be composed.
    tolerance: Callable[[dict, dict, object], dict] | None = None

    # --- the wiring ----------------------------------------------------------------------------

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"pipeline {self.name} has no stage {name!r}; stages: "
                       + ", ".join(s.name for s in self.stages))

    def source(self, stage: Stage, input_name: str) -> str:
        """Where a stage's input comes from: "<stage>.<output>" or a pipeline input's name."""
        return stage.wires.get(input_name, input_name)

    def output_sources(self) -> dict[str, str]:
        if self.outputs is not None:
            return dict(self.outputs)
        last = self.stages[-1]
        return {t.name: f"{last.name}.{t.name}" for t in last.spec.outputs}

    def stage_dims(self, stage: Stage, dims: Mapping[str, int]) -> dict[str, int]:
        out = {}
        for d in stage.spec.dims:
            given = stage.dims.get(d, d)
            out[d] = given if isinstance(given, int) else dims[given]
        return out

    def stage_params(self, stage: Stage, params: Mapping[str, object]) -> dict[str, object]:
        spec = stage.spec
        return {**{k: v for k, v in params.items() if k in spec.params}, **stage.params}

    def stage_case(self, case, stage: Stage | str):
        """The case stage `stage` runs: its op, its dims and params drawn from the pipeline
        case's, the same dtype, distribution and seed. Built by the case's own class
        (`cases.model.Case`): the oracle layer imports nothing above it."""
        stage = self.stage(stage) if isinstance(stage, str) else stage
        return type(case).make(stage.op, self.stage_dims(stage, case.dims), case.dtype, case.dist,
                         case.seed, self.stage_params(stage, case.params),
                         label=f"{case.label} stage:{stage.name}".strip())

    def stage_inputs(self, stage: Stage, values: Mapping[str, object], case=None) -> dict:
        """A stage's inputs from `values` (pipeline inputs and "<stage>.<output>" entries).
        With `case` (the pipeline's), each array's shape is checked against the stage op's."""
        got = {}
        for t in stage.spec.inputs:
            src = self.source(stage, t.name)
            if src not in values:
                raise KeyError(f"pipeline {self.name}, stage {stage.name}: input {t.name!r} "
                               f"wired to {src!r}, which is not available yet")
            got[t.name] = values[src]
            if case is not None and isinstance(got[t.name], np.ndarray):
                want = t.shape_of(self.stage_case(case, stage))
                if got[t.name].shape != want:
                    raise ValueError(f"pipeline {self.name}, stage {stage.name}: input "
                                     f"{t.name!r} from {src!r} has shape {got[t.name].shape}, "
                                     f"the op wants {want}")
        return got

    # --- the composition ------------------------------------------------------------------------

    def run_oracles(self, inputs: dict, case) -> tuple[dict, dict]:
        """(exact pre-store value of every stage output, the same rounded to its dtype in its
        storage dtype), keyed "<stage>.<output>": each stage on the stored outputs before it."""
        values, exact = dict(inputs), {}
        for stage in self.stages:
            sc = self.stage_case(case, stage)
            with np.errstate(invalid="ignore"):
                got = stage.spec.oracle(self.stage_inputs(stage, values, case), sc)
            for t in stage.spec.outputs:
                key, dtype = f"{stage.name}.{t.name}", t.dtype(case)
                exact[key] = np.asarray(got[t.name], dtype=np.float64)
                values[key] = round_to(exact[key], dtype).astype(storage_dtype(dtype),
                                                                 copy=False)
        return exact, {k: v for k, v in values.items() if k in exact}

    def oracle(self, inputs: dict, case) -> dict:
        exact, _ = self.run_oracles(inputs, case)
        return {name: exact[src] for name, src in self.output_sources().items()}

    def kernel(self, A, inputs: dict, case) -> dict:
        """The stages' kernel models chained in arithmetic A (module docstring): each stored
        intermediate an interval around the exact composition's stored value."""
        _, centers = self.run_oracles(inputs, case)
        values, got = dict(inputs), {}
        for stage in self.stages:
            sc = self.stage_case(case, stage)
            stage_in = self.stage_inputs(stage, values)
            fed = any("." in self.source(stage, t.name) for t in stage.spec.inputs)
            try:
                got[stage.name] = stage.spec.kernel(A, stage_in, sc)
            except (TypeError, ValueError) as e:
                if not fed:
                    raise
                raise TypeError(f"pipeline {self.name}, stage {stage.name} ({stage.op}): its "
                                f"kernel model cannot take an earlier stage's output as an "
                                f"interval (read inputs through A.load), or failed: {e}; give "
                                "the pipeline a `tolerance`") from e
            for t in stage.spec.outputs:
                key = f"{stage.name}.{t.name}"
                values[key] = A.stored(got[stage.name][t.name], t.dtype(case),
                                       centers[key])
        out = {}
        for name, src in self.output_sources().items():
            stage_name, output = src.split(".", 1)
            out[name] = got[stage_name][output]  # pre-store: OpSpec.bounds applies the store
        return out

    # --- the op ---------------------------------------------------------------------------------

    def spec(self) -> OpSpec:
        """This pipeline as an op (validated: every wire, name and default)."""
        if not self.stages:
            raise ValueError(f"pipeline {self.name}: no stages")
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names) or any("." in n for n in names):
            raise ValueError(f"pipeline {self.name}: stage names must be unique, without '.': "
                             f"{names}")
        inputs: dict[str, tuple[str, TensorSpec]] = {}
        produced: set[str] = set()
        dims: list[str] = []
        params: dict[str, object] = {}
        for stage in self.stages:
            spec = stage.spec
            for t in spec.outputs:
                if t.aliases:
                    raise ValueError(f"pipeline {self.name}, stage {stage.name}: {stage.op} "
                                     "updates an input in place; stages with aliased outputs "
                                     "are not supported yet")
            for d in spec.dims:
                given = stage.dims.get(d, d)
                if isinstance(given, str) and given not in dims:
                    dims.append(given)
            for k, v in spec.params.items():
                if k in stage.params:
                    continue
                if k in params and params[k] != v and k not in self.params:
                    raise ValueError(f"pipeline {self.name}: param {k!r} defaults to "
                                     f"{params[k]!r} in one stage and {v!r} in {stage.name}; "
                                     "set it in Pipeline(params=...) or Stage(params=...)")
                params.setdefault(k, v)
            for t in spec.inputs:
                src = self.source(stage, t.name)
                if "." in src:
                    if src not in produced:
                        raise ValueError(f"pipeline {self.name}, stage {stage.name}: input "
                                         f"{t.name!r} wired to {src!r}, not an output of an "
                                         f"earlier stage; earlier: {sorted(produced)}")
                    continue
                if src in inputs:
                    first, _ = inputs[src]
                    if t.name not in stage.wires:
                        raise ValueError(
                            f"pipeline {self.name}: input {src!r} of stage {stage.name} is also "
                            f"an input of stage {first}: wire one of them to another name "
                            f"(Stage(wires={{{t.name!r}: '{src}_{stage.name}'}})), or wire it "
                            "explicitly to share it")
                    continue
                inputs[src] = (stage.name, replace(t, name=src, shape=self._shape(stage, t)))
            produced |= {f"{stage.name}.{t.name}" for t in spec.outputs}
        outputs = []
        for name, src in self.output_sources().items():
            stage_name, output = src.split(".", 1) if "." in src else (src, "")
            if src not in produced:
                raise ValueError(f"pipeline {self.name}: output {name!r} from {src!r}, not a "
                                 f"stage output; stage outputs: {sorted(produced)}")
            stage = self.stage(stage_name)
            t = next(t for t in stage.spec.outputs if t.name == output)
            outputs.append(replace(t, name=name, shape=self._shape(stage, t)))
        kernel, tolerance = self.kernel, self.tolerance
        if tolerance is None and any(s.spec.kernel is None for s in self.stages):
            missing = [s.name for s in self.stages if s.spec.kernel is None]
            raise ValueError(f"pipeline {self.name}: stages {missing} have no kernel model to "
                             "compose: give the pipeline a `tolerance`")
        if tolerance is not None:
            kernel = None
        return OpSpec(
            name=self.name, family=self.family, dims=tuple(dims),
            inputs=tuple(t for _, t in inputs.values()), outputs=tuple(outputs),
            oracle=self.oracle, tolerance=tolerance, kernel=kernel,
            bytes=lambda case: sum(s.spec.bytes(self.stage_case(case, s)) for s in self.stages),
            flops=lambda case: sum(s.spec.flops(self.stage_case(case, s)) for s in self.stages),
            params={**params, **self.params}, version=self.oracle_version(),
            doc=self.doc or f"pipeline: {' -> '.join(f'{s.name} ({s.op})' for s in self.stages)}",
            inf_may_be_nan=any(s.spec.inf_may_be_nan for s in self.stages), pipeline=self,
            chain_input=self._chain_input())

    def _chain_input(self) -> str:
        """The pipeline input that the op before it writes: its first stage's chain input,
        under its pipeline name ("" where that op declares none)."""
        first = self.stages[0]
        name = first.spec.chain_input
        return self.source(first, name) if name else ""

    def oracle_version(self) -> str:
        """The pipeline's version and its stage ops': a stage's new oracle is a new pipeline
        oracle, so its cases get new ids."""
        return f"{self.version}:" + ",".join(f"{s.op}={s.spec.version}" for s in self.stages)

    def _shape(self, stage: Stage, t: TensorSpec):
        """A stage tensor's shape as a function of the pipeline's dims and params."""
        return lambda dims, params: t.shape_for(
            self.stage_dims(stage, dims), {**stage.spec.params, **self.stage_params(stage, params)})


def register_pipeline(pipeline: Pipeline) -> OpSpec:
    """Register `pipeline` as an op (its stages' ops must be registered already: a module
    defining a pipeline imports the modules of its stages' ops first)."""
    return register(pipeline.spec())
