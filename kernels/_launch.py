"""Lean launches of the pack's Triton kernels, and the record warmup tests read.

Triton's own launch path (``kernel[grid](*args)``) binds and specialises every argument,
builds a cache key, builds launch metadata for profiler hooks and then calls the compiled
kernel's launcher: several microseconds of host time per launch. The metadata kernels of
this pack launch once or twice per serving step on a host-bound path, so :class:`Kernel`
keeps its own cache keyed by the *pack's* specialisation key (constexpr values and the
argument dtypes the op lets vary, computed by each op's launcher from data it already
has) and, after the first launch of a key, calls the compiled kernel's launcher directly
(the same call ``JITFunction.run`` ends with, Triton 3.6 and 3.9).

That shortcut is only sound because every runtime ``int`` parameter is declared
``do_not_specialize`` and every pointer ``do_not_specialize_on_alignment`` (see
:func:`jit`): Triton's specialisation then depends on nothing but the dtypes and the
constexprs, which the pack's key contains. Pointers that a kernel wants specialised on
16-byte alignment (the wide row copies) are named in ``align=`` and their alignment goes
into the key. ``SWA_TRITON_CHECK_KEYS=1`` makes every launch also go through Triton's own
path and asserts that both picked the same compiled kernel (a GPU test runs with it).

``SWA_TRITON_FAST_LAUNCH=0`` turns the shortcut off (every launch through Triton's path).
Under the interpreter (``TRITON_INTERPRET=1``) launches always take Triton's path. This
module decorates no kernel (it may be imported before ``interpreter.setup``); the device
helpers shared by the kernels live in ``_device``.
"""

from __future__ import annotations

import inspect
import os

import triton

FAST = os.environ.get("SWA_TRITON_FAST_LAUNCH", "1") != "0"
CHECK_KEYS = os.environ.get("SWA_TRITON_CHECK_KEYS", "0") == "1"

#: Every (kernel name, key) launched in this process: warmup tests compare it before and
#: after a serving-like call (on the interpreter, where nothing is compiled).
LAUNCHED: set[tuple[str, tuple]] = set()
KERNELS: dict[str, "Kernel"] = {}


def jit(fn=None, *, align: tuple[str, ...] = ()):
    """``triton.jit`` with every runtime ``int`` parameter ``do_not_specialize`` and every
    pointer (name ending in ``_ptr``) ``do_not_specialize_on_alignment``, except the
    pointers named in ``align``. Serving-step sizes (T, B, strides) then never trigger
    a recompile, and the launch key stays what :class:`Kernel` callers compute."""

    def deco(f):
        ints, ptrs = [], []
        for name, p in inspect.signature(f).parameters.items():
            if "constexpr" in str(p.annotation):
                continue
            (ptrs if name.endswith("_ptr") else ints).append(name)
        unaligned = [p for p in ptrs if p not in align]
        return triton.jit(f, do_not_specialize=ints, do_not_specialize_on_alignment=unaligned)

    return deco(fn) if fn is not None else deco


class Kernel:
    """A Triton kernel plus the pack's launch cache.

    ``kernel(key, grid, *args)``: ``key`` a hashable tuple that determines Triton's
    specialisation (constexprs + varying dtypes + declared alignments), ``grid`` a
    3-tuple, ``args`` every kernel parameter in order, constexprs included.
    """

    __slots__ = ("fn", "name", "launches", "_fast", "_get_device", "_get_stream", "_runtime")

    def __init__(self, fn, name: str | None = None):
        self.fn = fn
        inner = getattr(fn, "fn", fn)
        self.name = name or f"{inner.__module__.rsplit('.', 1)[-1]}.{inner.__qualname__}"
        self.launches = 0  # every launch of this kernel in this process (tests count them)
        self._fast: dict = {}
        self._get_device = None
        self._get_stream = None
        self._runtime = None
        KERNELS[self.name] = self

    def __call__(self, key: tuple, grid: tuple, *args) -> None:
        self.launches += 1
        if FAST and not CHECK_KEYS:
            dev = self._get_device() if self._get_device is not None else None
            entry = self._fast.get((dev, key))
            if entry is not None:
                run, function, packed, ck = entry
                rt = self._runtime
                enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
                stream = self._get_stream(dev)
                if _empty(enter) and _empty(leave):
                    run(grid[0], grid[1], grid[2], stream, function, packed, None, None, None, *args)
                else:
                    meta = ck.launch_metadata(grid, stream, *args)
                    run(grid[0], grid[1], grid[2], stream, function, packed, meta, enter, leave, *args)
                return
        self._slow(key, grid, args)

    def _slow(self, key: tuple, grid: tuple, args: tuple) -> None:
        ck = self.fn[grid](*args)
        LAUNCHED.add((self.name, key))
        if ck is None or not hasattr(ck, "packed_metadata"):  # the interpreter returns nothing to cache
            return
        from triton.runtime import driver

        if self._get_device is None:
            import triton.knobs as knobs

            self._runtime = knobs.runtime
            self._get_device = driver.active.get_current_device
            self._get_stream = driver.active.get_current_stream
        dev = self._get_device()
        entry = self._fast.get((dev, key))
        if entry is None:
            self._fast[(dev, key)] = (ck.run, ck.function, ck.packed_metadata, ck)
        elif CHECK_KEYS and entry[3] is not ck:
            raise AssertionError(
                f"{self.name}: launch key {key} maps to two compiled kernels; the key misses a specialisation")

    def compiled(self) -> int:
        """Number of compiled variants Triton holds for this kernel (all devices)."""
        return compiled_count(self.fn)


def _empty(hook) -> bool:
    return hook is None or (hasattr(hook, "calls") and not hook.calls)


def compiled_count(fn) -> int:
    caches = getattr(fn, "device_caches", None)
    if not caches:
        return 0
    return sum(len(entry[0]) for entry in caches.values())


def total_launches() -> int:
    return sum(k.launches for k in KERNELS.values())


def total_compiled() -> dict[str, int]:
    """Compiled variants per kernel of this pack (Triton's caches): a warmed-up serving
    path must leave it unchanged."""
    return {name: k.compiled() for name, k in KERNELS.items()}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def contiguous(t):
    """``t`` itself when contiguous (no copy, no new tensor object)."""
    return t if t.is_contiguous() else t.contiguous()
