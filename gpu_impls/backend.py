"""Backends: how arrays reach a device and come back, and whether the device is here.

Each backend package (`gpu_impls/cuda`, `torch`, `mlx`, `metal`) defines one `Backend` in its
`backend.py`. Importing a backend module never imports its framework: `available()` does, so
`kparity ops` can explain on any machine why a backend is missing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oracle.dtypes import storage_dtype

# Outputs are poisoned before a launch with a quiet NaN whose payload no arithmetic produces
# (GPUs return the canonical NaN, CPUs propagate an input's payload and inputs carry none): an
# element still holding these bits after the launch was never written.
POISON_BITS = {"f32": np.uint32(0x7FC0DEAD), "f16": np.uint16(0x7EAD),
               "bf16": np.uint16(0x7FED), "u32": np.uint32(0xFFFFFFFF),
               "i32": np.uint32(0xFFFFFFFF), "u8": np.uint8(0xFF)}
# Guard regions (canaries) on both sides of every output: another NaN payload, distinct from
# the poison and from anything a kernel computes, so any write there changes their bits. 4 KiB
# a side keeps the output as aligned as the allocation (CUDA allocators: >= 256 bytes) and
# catches a write up to 1024 f32 / 2048 bf16 elements out.
CANARY_BITS = {"f32": np.uint32(0xFFA5A5A5), "f16": np.uint16(0xFFA5),
               "bf16": np.uint16(0xFFA5), "u32": np.uint32(0xA5A5A5A5),
               "i32": np.uint32(0xA5A5A5A5), "u8": np.uint8(0xA5)}
GUARD_BYTES = 4096
INDICES_SHOWN = 8


def poisoned_host(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    bits = POISON_BITS[dtype]
    return np.full(shape, bits, dtype=bits.dtype).view(storage_dtype(dtype))


@dataclass
class GuardedOutput:
    """A poisoned output (`array`, the device view an impl writes) inside a larger device
    allocation (`whole`) whose `guard` elements on each side hold `CANARY_BITS`. `poisoned`:
    the flat mask of the elements poisoned (None: all); the others hold an input's values (an
    output aliasing an input, `TensorSpec.aliases`)."""

    array: object
    whole: object
    shape: tuple[int, ...]
    dtype: str
    guard: int
    poisoned: np.ndarray | None = None

    def read(self, backend) -> tuple[np.ndarray, list[tuple[str, str]]]:
        """(the output on the host, defects as (flag, text)): out-of-bounds writes (guard elements changed,
        at flat indices relative to the output's start: -1 is the element before it, n the
        one past its end) and unwritten elements (still the poison bits; float outputs)."""
        whole = backend.to_host(self.whole, self.dtype)
        bits = whole.view(POISON_BITS[self.dtype].dtype)
        n, g = int(np.prod(self.shape, dtype=np.int64)), self.guard
        canary = CANARY_BITS[self.dtype]
        written = np.concatenate([np.flatnonzero(bits[:g] != canary) - g,
                                  np.flatnonzero(bits[g + n:] != canary) + n])
        defects = []
        if written.size:
            defects.append(("oob_write", f"out-of-bounds write: {_indices(written)} (the output has {n} "
                           f"elements; {g} guard elements checked on each side)"))
        if self.dtype in ("f32", "f16", "bf16"):
            left = bits[g:g + n] == POISON_BITS[self.dtype]
            unwritten = np.flatnonzero(left if self.poisoned is None else left & self.poisoned)
            if unwritten.size:
                defects.append(("unwritten", f"never written (still the poison NaN): "
                                              f"{_indices(unwritten)} of {n} elements"))
        return whole[g:g + n].reshape(self.shape), defects


def outside_region(host: np.ndarray, before: np.ndarray, written: np.ndarray
                   ) -> list[tuple[str, str]]:
    """Defects of an output that aliases an input: elements outside the region the op writes
    (`written`, a boolean mask) whose bits differ from the input's (`before`)."""
    bits = np.ascontiguousarray(host).reshape(-1).view(np.uint8).reshape(host.size, -1)
    old = np.ascontiguousarray(before).reshape(-1).view(np.uint8).reshape(before.size, -1)
    changed = np.flatnonzero((bits != old).any(axis=1) & ~written.reshape(-1))
    if not changed.size:
        return []
    return [("outside_region", f"write outside the region the op writes: {_indices(changed)} "
             f"changed (it writes {int(written.sum())} of {written.size} elements; the rest "
             "must keep the input's bits)")]


def _indices(flat: np.ndarray) -> str:
    shown = ", ".join(str(int(i)) for i in flat[:INDICES_SHOWN])
    more = f" and {flat.size - INDICES_SHOWN} more" if flat.size > INDICES_SHOWN else ""
    return f"{flat.size} element(s) at flat index {shown}{more}"


class Backend:
    name: str = ""
    writes_in_place: bool = True  # False: impls return fresh arrays, nothing to poison
    # True where every kernel runs with f32 subnormals flushed to zero (FTZ); the runner then
    # asks the oracle for FTZ semantics (ops that model it take the `ftz` param).
    flushes_subnormals: bool = False

    def available(self) -> tuple[bool, str]:
        raise NotImplementedError

    def device(self) -> str:
        """The device impls of this backend run on here, e.g. 'cuda:0 NVIDIA H100', 'cpu'."""
        raise NotImplementedError

    @property
    def accelerator(self) -> bool:
        return self.device() != "cpu"

    def versions(self) -> dict[str, str]:
        return {}

    def to_device(self, array: np.ndarray):
        raise NotImplementedError

    def poisoned(self, shape: tuple[int, ...], dtype: str):
        return self.to_device(poisoned_host(shape, dtype))

    def guarded(self, shape: tuple[int, ...], dtype: str, fill: np.ndarray | None = None,
                poison: np.ndarray | None = None) -> GuardedOutput:
        """A poisoned output between two guard regions, all one device allocation: the output
        is a contiguous view into it (a slice, then a reshape: the same on CuPy and torch).
        An output aliasing an input: `fill` holds the input's values, and only the elements of
        the boolean mask `poison` are poisoned."""
        bits = POISON_BITS[dtype]
        n, g = int(np.prod(shape, dtype=np.int64)), GUARD_BYTES // bits.itemsize
        host = np.full(n + 2 * g, CANARY_BITS[dtype], dtype=bits.dtype)
        host[g:g + n] = bits
        if fill is not None:
            inner = np.ascontiguousarray(fill, dtype=storage_dtype(dtype)).reshape(-1)
            keep = np.ones(n, dtype=bool) if poison is None else ~poison.reshape(-1)
            host[g:g + n][keep] = inner.view(bits.dtype)[keep]
        whole = self.to_device(host.view(storage_dtype(dtype)))
        mask = None if fill is None else (np.zeros(n, dtype=bool) if poison is None
                                          else poison.reshape(-1).copy())
        return GuardedOutput(whole[g:g + n].reshape(shape), whole, tuple(shape), dtype, g, mask)

    def to_host(self, array, dtype: str) -> np.ndarray:
        raise NotImplementedError

    def same_memory(self, a, b) -> bool:
        """Whether device arrays `a` and `b` start at the same address (a view of an output
        returned by an impl is that output)."""
        return a is b

    def synchronize(self) -> None:
        pass

    def timer(self):
        """The backend's `gpu_impls.timer.Timer` (device clock, graphs, flush, ceilings)."""
        from gpu_impls.timer import HOST_TIMER

        return HOST_TIMER
