"""Staged impls of a pipeline op (`oracle/pipeline.py`): one registered impl per stage.

    register(staged("norm_scale", "torch", "norm_scale_staged",
                    {"norm": "torch:rms_norm", "scale": "torch:scale"}))

The impl runs the stages' impls in order on one backend, each on the stage case
(`Pipeline.stage_case`) and the device arrays the earlier stages produced, so `kparity bench`
times the chain. Its contract (`StageContracts`) is every stage impl's contract on its stage
case, all checked before anything launches; an invariant is named `"<stage>: <invariant>"`. The
runner checks a staged impl stage by stage (`runners/pipeline_check.py`) and end to end.
Stage impls are looked up when first needed, so a staged impl may name impls registered later.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from gpu_impls.contract import ContractError, Invariant
from gpu_impls.impl import Impl


class StageContracts:
    """The contracts of a staged impl's stage impls, each on its stage's case (the interface
    of `gpu_impls.contract.Contract`: `check`, `broken`, `admits`, `invariants`, `dtypes`)."""

    def __init__(self, pipeline_op: str, backend: str, stages: Mapping[str, str]):
        self.pipeline_op, self.backend, self.stage_ids = pipeline_op, backend, dict(stages)
        self._named = self._resolved = None

    geometry = None

    def resolve(self):
        """(the Pipeline, {stage name: Impl}), validated: every stage named, each impl of its
        stage's op, all on one backend."""
        import gpu_impls
        from oracle.spec import get_op

        if self._resolved is not None:
            return self._resolved
        pipeline = get_op(self.pipeline_op).pipeline
        if pipeline is None:
            raise ValueError(f"{self.pipeline_op} is an op, not a pipeline")
        names = [s.name for s in pipeline.stages]
        if sorted(names) != sorted(self.stage_ids):
            raise ValueError(f"staged impl of {self.pipeline_op}: stages {sorted(self.stage_ids)}"
                             f", the pipeline has {names}")
        registered = gpu_impls.impls()
        out = {}
        for stage in pipeline.stages:
            impl_id = self.stage_ids[stage.name]
            if impl_id not in registered:
                raise KeyError(f"staged impl of {self.pipeline_op}: stage {stage.name} names "
                               f"impl {impl_id!r}, which is not registered")
            impl = registered[impl_id]
            if impl.op != stage.op:
                raise ValueError(f"staged impl of {self.pipeline_op}: stage {stage.name} runs "
                                 f"op {stage.op}, impl {impl_id} is of op {impl.op}")
            out[stage.name] = impl
        if {i.backend for i in out.values()} != {self.backend}:
            raise ValueError(f"staged impl of {self.pipeline_op} on {self.backend}: every stage "
                             f"impl must be too ({', '.join(sorted(self.stage_ids.values()))})")
        self._resolved = pipeline, out
        return self._resolved

    @property
    def dtypes(self) -> tuple[str, ...]:
        each = [i.contract.dtypes for i in self.resolve()[1].values()]
        return tuple(d for d in each[0] if all(d in other for other in each[1:]))

    def named(self) -> list[tuple[str, Invariant, Invariant]]:
        """(stage, invariant named for its stage, the stage contract's own invariant)."""
        if self._named is None:
            self._named = [(s, replace(inv, name=f"{s}: {inv.name}"), inv)
                           for s, impl in self.resolve()[1].items()
                           for inv in impl.contract.invariants]
        return self._named

    @property
    def invariants(self) -> tuple[Invariant, ...]:
        return tuple(named for _, named, _ in self.named())

    def broken(self, case) -> list[Invariant]:
        pipeline, impls = self.resolve()
        out = []
        for stage, impl in impls.items():
            own = impl.contract.broken(pipeline.stage_case(case, stage))
            out += [named for s, named, inv in self.named() if s == stage and inv in own]
        return out

    def check(self, impl_id: str, case) -> dict:
        """{stage: that stage impl's launch}, every stage checked before anything launches."""
        pipeline, impls = self.resolve()
        launches = {}
        for stage, impl in impls.items():
            try:
                launches[stage] = impl.contract.check(impl.id, pipeline.stage_case(case, stage))
            except ContractError as e:
                raise ContractError(impl_id, f"{stage}: {e.invariant}", e.values,
                                    f"{e.why} (stage {stage}, {e.impl})", e.fix,
                                    launch=stage) from None
        return launches

    def admits(self, case) -> bool:
        return case.dtype in self.dtypes and not self.broken(case)


def staged(pipeline_op: str, backend: str, name: str, stages: Mapping[str, str],
           doc: str = "") -> Impl:
    """A staged impl of pipeline op `pipeline_op` on `backend`: stage name -> impl id."""
    contracts = StageContracts(pipeline_op, backend, stages)

    def run(launch, inputs, outputs, case):
        import gpu_impls

        pipeline, impls = contracts.resolve()
        be = gpu_impls.backend(backend)
        finals = {src: name for name, src in pipeline.output_sources().items()}
        values, result = dict(inputs), {}
        for stage in pipeline.stages:
            impl, sc = impls[stage.name], pipeline.stage_case(case, stage)
            own = None
            if outputs is not None:  # in place: the chain's own outputs, else fresh buffers
                own = {t.name: outputs[finals[f"{stage.name}.{t.name}"]]
                       if f"{stage.name}.{t.name}" in finals
                       else be.poisoned(t.shape_of(sc), t.dtype(sc.dtype))
                       for t in stage.spec.outputs}
            got = impl.run(launch[stage.name], pipeline.stage_inputs(stage, values), own, sc)
            got = got if got is not None else own
            for t in stage.spec.outputs:
                key = f"{stage.name}.{t.name}"
                values[key] = got[t.name]
                if key in finals:
                    result[finals[key]] = got[t.name]
        return result

    def requires():
        import gpu_impls

        for impl in contracts.resolve()[1].values():
            ok, why = impl.available(gpu_impls.backend(impl.backend))
            if not ok:
                return False, f"stage impl {impl.id}: {why}"
        return True, ""

    return Impl(pipeline_op, backend, name, run, contracts, requires=requires,
                doc=doc or "staged: " + ", ".join(f"{s} = {i}" for s, i in stages.items()),
                stages=dict(stages))
