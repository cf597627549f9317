"""The bottom of `runners/`: the errors a runner raises to the CLI and how long a case may take.
Every other runner may import this module; it imports none of them."""

from __future__ import annotations

# The per-case timeout's terms (`case_timeout`).
BASE_S = 30.0
COMPILE_S = 90.0
BYTES_PER_S = 10e6


class BadInput(ValueError):
    """Bad input a runner finds (an executor's flags, a cluster that cannot run the work): the
    CLI prints it as a usage error, exit code 2 (runners never import the verbs)."""


class DeviceUnusable(RuntimeError):
    """The probe after a crash or timeout failed: the sweep cannot go on on this device."""


def case_timeout(case, first_of_shape: bool) -> float:
    """Seconds a worker gets for one case before it is declared hung: 30 s, plus 90 s the first
    time this worker runs the impl on this (dtype, dims) (CuPy's NVRTC compile and
    torch.compile's per-shape recompile take tens of seconds), plus 1 s per 10 MB the case's
    tensors hold (inputs drawn, the float64 oracle and the metrics all run in the worker too).
    Generous on purpose: it exists to catch infinite loops, not slow kernels."""
    return (BASE_S + (COMPILE_S if first_of_shape else 0.0)
            + case.spec.io_bytes(case) / BYTES_PER_S)
