"""The impl: one implementation of one op on one backend, with its contract.

`run(launch, inputs, outputs, case)` receives device arrays: `inputs` already on the backend, and
`outputs` pre-allocated and poisoned with NaN by the runner (backends that write in place: cuda,
torch), or `None` (functional backends: mlx, which return new arrays). It returns the outputs as
a dict, or None when it wrote into `outputs`. `launch` is the geometry the contract derived and
checked; a kernel launches with exactly that geometry. An impl with several launches declares
`launches={"split": Contract(...), "combine": Contract(...)}` instead of `contract=` (a
`Launches`): every launch is checked before any runs, and `launch` is the dict of them.

An output that aliases an input (`TensorSpec.aliases`) is that input's buffer: `outputs[name]`
and `inputs[input]` are the same device array; the impl updates it in place (or, on a
functional backend, returns the whole updated tensor).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from gpu_impls.contract import NO_CONTRACT, Contract, Launch, Launches
from oracle.numerics import DEFAULT as DEFAULT_NUMERICS
from oracle.numerics import Numerics


@dataclass(frozen=True)
class ExactPeer:
    """An impl-vs-impl contract: this impl equals impl `peer` bit for bit (tolerance 0) on the
    sub-problems `split(case, inputs)` lists, each `(label, own case, own inputs, peer case,
    peer inputs)`; e.g. an expert-indexed GEMV and the plain GEMV on every expert's slab."""

    peer: str
    split: Callable[[object, dict], list[tuple[str, object, dict, object, dict]]]


@dataclass(frozen=True)
class Impl:
    op: str
    backend: str
    name: str
    run: Callable[[Launch | None, dict, dict | None, object], dict | None]
    contract: Contract = NO_CONTRACT
    deterministic: bool = True
    doc: str = ""
    # What the impl needs beyond its backend (e.g. torch.compile needs a GPU and Triton):
    # () -> (ok, why not). None: the backend being available is enough.
    requires: Callable[[], tuple[bool, str]] | None = None
    # An impl that compiles once per case shape (torch.compile: seconds each) runs the GPU gate,
    # and a sweep that does not name it with --impl, on at most this many valid
    # normal-distribution cases spread over dtypes (`cases.generate.sampled`). None: all.
    gate_cases_max: int | None = None
    # Non-empty: why this impl is a speed baseline computing a neighbouring function, not the op
    # (e.g. a dense bf16 F.linear standing in for a quantized GEMV: what a user would run
    # instead). `check` runs only its contract's rejections; bench and ab record its oracle
    # check as `report` and time it anyway.
    report_only: str = ""
    # Set: the impl must equal another impl bit for bit where `ExactPeer.split` says.
    exact_peer: ExactPeer | None = None
    # Row i of a batch equals the batch-of-1 result on row i bit for bit (`OpSpec.batch`): True
    # on every device, or the `Backend.device()` prefixes where it was verified (e.g. ("cpu",)).
    batch_invariant: bool | tuple[str, ...] = False
    # Non-empty: why a call reads device data on the host mid-call (e.g. `offsets.cpu()` to
    # size a loop, `torch.bincount`'s max): such a call cannot be captured in a CUDA graph, so
    # `chain` and `graph_rot` time it uncaptured (`runners/timing.py`), as a user's step would
    # run it, and the row says so.
    host_sync: str = ""
    # What the impl declares about its f32 arithmetic (`oracle/numerics.py`): the order of its
    # sums (default: any order, the bound that holds for every kernel) and its functions' ULPs.
    # A declared order tightens the bound; it must be true of the impl on every device. A
    # kernel whose order follows its launch geometry declares a function of the case
    # (`numerics_for`).
    numerics: Numerics | Callable[[object], Numerics] = DEFAULT_NUMERICS
    # Several launches, each with its own contract (see the module docstring); sets `contract`.
    launches: Mapping[str, Contract] | None = field(default=None, compare=False)
    # Set: a staged impl of a pipeline op (`gpu_impls/staged.py`): stage name -> the impl id
    # that runs it. The runner checks each stage on the previous stage's output.
    stages: Mapping[str, str] | None = field(default=None, compare=False)
    # Set: (the op's weight inputs, case) -> extra inputs that `run` uses instead of computing
    # them from the weights (torch:dequant_linear's f32 W_hat). Only a runner whose weights
    # stay the same over a run calls it, once per weight: the model's decode loop
    # (`models.decode.Decoder`), as an engine dequantizes at load. `run` must return the same
    # bits with them as without (tests); check, bench and ab never prepare, so they check and
    # time the whole op at every call. A wrapper that edits the weights `run` reads (a bite
    # mutant) must drop it: `dataclasses.replace(impl, prepare=None)`.
    prepare: Callable[[dict, object], dict] | None = field(default=None, compare=False)

    def __post_init__(self):
        if self.launches is not None:
            built = isinstance(self.contract, Launches) and \
                self.contract.contracts == dict(self.launches)  # dataclasses.replace of one
            if self.contract is not NO_CONTRACT and not built:
                raise ValueError(f"impl {self.id}: give `contract` or `launches`, not both")
            object.__setattr__(self, "contract", Launches(dict(self.launches)))

    def available(self, backend) -> tuple[bool, str]:
        ok, why = backend.available()
        if ok and self.requires is not None:
            ok, why = self.requires()
        return ok, why

    def batch_invariant_on(self, device: str) -> bool:
        """Whether the impl declares batch invariance on `device` (a `Backend.device()`)."""
        if isinstance(self.batch_invariant, bool):
            return self.batch_invariant
        return device.startswith(self.batch_invariant)

    def numerics_for(self, case) -> Numerics:
        """What the impl declares for `case`, with its backend's function ULPs where it names
        none: the numerics the case's bounds are computed for."""
        numerics = self.numerics(case) if callable(self.numerics) else self.numerics
        return numerics.on(self.backend)

    @property
    def declares_order(self) -> bool:
        """Whether the impl declares the order of its sums (else every order is admitted)."""
        return callable(self.numerics) or self.numerics.declares_order

    @property
    def id(self) -> str:
        return f"{self.backend}:{self.name}"

    def __call__(self, inputs: dict, outputs: dict | None, case) -> dict | None:
        launch = self.contract.check(self.id, case)
        return self.run(launch, inputs, outputs, case)
