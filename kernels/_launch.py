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

On the shortcut, pointer arguments go to the launcher as integers (``tensor.data_ptr()``,
in a small launch function generated per key from the signature, see
:func:`fast_launcher`): the launcher then skips its per-pointer ``cuPointerGetAttribute``
query, a driver call per tensor argument (a dozen per launch here). The first launch of a
key (Triton's path) still checks every pointer; with validation off, a CPU tensor passed
later is not caught (it is an invalid device address). ``SWA_TRITON_PTR_INTS=0`` (or
:func:`set_pointer_ints`) passes the tensors instead.

The generated function calls the C ``launch`` function inside Triton's ``CudaLauncher``
directly, skipping that object's Python ``__call__`` (it only allocates scratch buffers the
pack's kernels do not ask for), where :func:`direct_call` recognises the launcher's layout
(Triton 3.6 and 3.9, tested against Triton's own ``__call__``);
``SWA_TRITON_DIRECT_LAUNCH=0`` (or :func:`set_direct_launch`) goes through the object.

Where it applies (CUDA, Triton 3.6 / 3.9, no scratch, see ``_claunch``), the pack's own C
launcher replaces both: ``launcher(grid, stream, *args)`` reads the pointers, packs the
parameters and calls ``cuLaunchKernelEx`` (``SWA_TRITON_C_LAUNCH_EX=0``: ``cuLaunchKernel``)
in one C call. It returns False, without
launching, when the calling thread has no current CUDA context; that launch then takes
Triton's path, which makes the context current. ``SWA_TRITON_C_LAUNCH=0`` (or
:func:`set_c_launch`) keeps Triton's compiled launcher.

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
PTR_INTS = os.environ.get("SWA_TRITON_PTR_INTS", "1") != "0"
#: Launch through the pack's C launcher (``_claunch``) where it applies (see :func:`set_c_launch`).
C_LAUNCH = os.environ.get("SWA_TRITON_C_LAUNCH", "1") != "0"

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

    __slots__ = ("fn", "name", "launches", "_fast", "_get_device", "_get_stream", "_hooks")

    def __init__(self, fn, name: str | None = None):
        self.fn = fn
        inner = getattr(fn, "fn", fn)
        self.name = name or f"{inner.__module__.rsplit('.', 1)[-1]}.{inner.__qualname__}"
        self.launches = 0  # every launch of this kernel in this process (tests count them)
        self._fast: dict = {}
        self._get_device = None
        self._get_stream = None
        self._hooks = None
        KERNELS[self.name] = self

    def __call__(self, key: tuple, grid: tuple, *args) -> None:
        self.launches += 1
        if FAST and not CHECK_KEYS:
            get_device = self._get_device
            if get_device is not None:
                dev = get_device()
                entry = self._fast.get((dev, key))
                if entry is not None:
                    rt = self._hooks
                    enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
                    launch, ck = entry
                    if (enter is None or not getattr(enter, "calls", True)) and \
                            (leave is None or not getattr(leave, "calls", True)):
                        if launch is not None:
                            if launch(grid, self._get_stream(dev), *args) is not False:
                                return
                            # the pack's C launcher found no current CUDA context on this
                            # thread: Triton's path below makes one current and launches
                        else:
                            ck.run(grid[0], grid[1], grid[2], self._get_stream(dev), ck.function, ck.packed_metadata,
                                   None, None, None, *args)
                            return
                    else:  # a profiler's hooks: give them Triton's launch metadata
                        stream = self._get_stream(dev)
                        meta = ck.launch_metadata(grid, stream, *args)
                        ck.run(grid[0], grid[1], grid[2], stream, ck.function, ck.packed_metadata, meta, enter, leave,
                               *args)
                        return
        self._slow(key, grid, args)

    def _slow(self, key: tuple, grid: tuple, args: tuple) -> None:
        ck = self.fn[grid](*args)
        LAUNCHED.add((self.name, key))
        if ck is None or not hasattr(ck, "packed_metadata"):  # the interpreter returns nothing to cache
            return
        if self._get_device is None:
            self._bind_runtime()
        dev = self._get_device()
        entry = self._fast.get((dev, key))
        if entry is None:
            names = [p.name for p in self.fn.params]
            launch = None
            if PTR_INTS and _pointers_follow_convention(names, args):
                if C_LAUNCH:  # with a profiling stub: the C launcher whose driver call records
                    from ._claunch import launcher_for

                    launch = launcher_for(ck, names, args, stub=_STUB is not None)
                if _STUB is not None:  # host-time profiling: everything but the launcher call
                    ck = _Stubbed(ck, _STUB)
                if launch is None:
                    launch = fast_launcher(ck, names, args)
            elif _STUB is not None:
                ck = _Stubbed(ck, _STUB)
            self._fast[(dev, key)] = (launch, ck)
        elif CHECK_KEYS and entry[1] is not ck:
            raise AssertionError(
                f"{self.name}: launch key {key} maps to two compiled kernels; the key misses a specialisation")

    def _bind_runtime(self) -> None:
        """Bind what the shortcut calls: the current device and stream getters Triton uses
        (torch's C getter for the device once CUDA is up: ``torch.cuda.current_device``
        also re-checks lazy initialisation) and Triton's runtime knobs (launch hooks)."""
        import torch
        import triton.knobs as knobs
        from triton.runtime import driver

        get_device = driver.active.get_current_device
        if get_device is torch.cuda.current_device and hasattr(torch._C, "_cuda_getDevice"):
            get_device = torch._C._cuda_getDevice
        self._hooks = knobs.runtime  # read per launch: a profiler may install hooks at any time
        self._get_stream = driver.active.get_current_stream
        self._get_device = get_device

    def compiled(self) -> int:
        """Number of compiled variants Triton holds for this kernel (all devices)."""
        return compiled_count(self.fn)


def _forget_fast_entries() -> None:
    """Drop every kernel's fast entries: the next launch of each key goes through Triton's
    path once and makes a new one under the launch settings of that moment."""
    for k in KERNELS.values():
        k._fast.clear()


def set_pointer_ints(enabled: bool) -> bool:
    """Pass pointers to the launcher as integers (default) or as tensors, for launches made
    from now on: forgets every kernel's fast entries (the next launch of each key goes
    through Triton's path once and makes a new one). Returns the previous setting."""
    global PTR_INTS
    previous, PTR_INTS = PTR_INTS, bool(enabled)
    _forget_fast_entries()
    return previous


def set_direct_launch(enabled: bool) -> bool:
    """Call the C launch function directly (default, see :func:`direct_call`) or through
    Triton's launcher object, for launches made from now on (forgets every fast entry, as
    :func:`set_pointer_ints`). Returns the previous setting."""
    global DIRECT
    previous, DIRECT = DIRECT, bool(enabled)
    _forget_fast_entries()
    return previous


def set_c_launch(enabled: bool) -> bool:
    """Launch through the pack's C launcher (default, see ``_claunch``) or through Triton's
    compiled launcher, for launches made from now on (forgets every fast entry, as
    :func:`set_pointer_ints`). Returns the previous setting."""
    global C_LAUNCH
    previous, C_LAUNCH = C_LAUNCH, bool(enabled)
    _forget_fast_entries()
    return previous


_STUB = None


def set_launcher_stub(stub) -> None:
    """Host-time profiling: from now on every shortcut launch calls ``stub`` (any callable,
    e.g. ``lambda *a: None``) with the arguments it would give the compiled kernel's
    launcher, instead of that launcher: the Python path of a launch, timed without the
    launcher's argument parsing, pointer checks and the driver's launch (nothing runs on
    the device). Where the pack's C launcher applies, it stays, and only its driver call is
    replaced (by the C module's recording function; ``stub`` is not called): what is timed
    is then everything but ``cuLaunchKernel``. ``None`` restores real launches. Forgets
    every fast entry (as :func:`set_pointer_ints`); the next launch of each key goes through
    Triton's path."""
    global _STUB
    _STUB = stub
    _forget_fast_entries()


class _Stubbed:
    """A compiled kernel whose ``run`` is the profiling stub (see :func:`set_launcher_stub`)."""

    def __init__(self, ck, stub):
        self.run, self.function, self.packed_metadata, self.ck = stub, ck.function, ck.packed_metadata, ck

    def launch_metadata(self, *args):
        return self.ck.launch_metadata(*args)


def fast_launcher(ck, names: list[str], first_args: tuple):
    """``launch(grid, stream, *args)``: ``ck``'s launcher call with every pointer
    argument passed as ``arg.data_ptr()`` and the launch metadata and hooks left out
    (``None``), generated from the parameter ``names`` (pointers end in ``_ptr``).

    ``first_args`` (the arguments of the key's first launch) fix which pointers may be
    None: one that was None may be None again (it stays None), one that was a tensor must
    be a tensor (the pack's keys carry every optional input's presence; a None there fails
    loudly). One generated expression per argument: no per-call loop or type test."""
    params = [f"a{i}" for i in range(len(names))]
    items = [(f"None if {a} is None else {a}.data_ptr()" if arg is None else f"{a}.data_ptr()")
             if name.endswith("_ptr") else a for a, name, arg in zip(params, names, first_args)]
    direct = direct_call(ck.run) if DIRECT else None
    if direct is None:  # through the launcher object (Triton's wrapper around its C launch)
        body = f"run(gx, gy, gz, stream, function, packed, None, None, None, {', '.join(items)})"
        target = ck.run
    elif direct[0] == "varargs":  # Triton 3.6: launch(grid, stream, function, coop, pdl, scratch x2, meta..., *args)
        body = (f"run(gx, gy, gz, stream, function, {direct[2]!r}, {direct[3]!r}, None, None, packed, None, None, "
                f"None, {', '.join(items)})")
        target = direct[1]
    else:  # Triton 3.9: launch(grid, stream, function, coop, pdl, meta..., scratch x2, annotations, signature, args)
        body = (f"run(gx, gy, gz, stream, function, {direct[2]!r}, {direct[3]!r}, packed, None, None, None, None, "
                f"None, annotations, signature, ({', '.join(items)},))")
        target = direct[1]
    src = (f"def make(run, function, packed, annotations, signature):\n"
           f"    def launch(grid, stream, {', '.join(params)}):\n"
           f"        gx, gy, gz = grid\n"
           f"        {body}\n"
           f"    return launch\n")
    namespace: dict = {}
    exec(compile(src, f"<fast_launcher {len(names)} args>", "exec"), namespace)  # noqa: S102
    annotations, signature = (direct[4], direct[5]) if direct is not None and direct[0] == "tuple" else (None, None)
    return namespace["make"](target, ck.function, ck.packed_metadata, annotations, signature)


#: Call the C function inside Triton's CUDA launcher object directly (see :func:`direct_call`).
DIRECT = os.environ.get("SWA_TRITON_DIRECT_LAUNCH", "1") != "0"


def direct_call(run):
    """How to call the C launch function inside ``run`` (a compiled kernel's launcher)
    without its Python ``__call__``, or None where that is not known to be equivalent.

    Triton's ``CudaLauncher.__call__`` (3.6 and 3.9) allocates the global and profile
    scratch buffers when the kernel asks for them, adds the GSan arguments when that
    sanitizer is on, and passes everything on to its C ``launch``. The pack's kernels ask
    for no scratch, so the wrapper only costs time on the host-bound path. Returned:
    ``("varargs", launch, coop, pdl)`` for Triton 3.6's layout (kernel arguments as
    trailing positionals, the scratch pointers before the metadata) or ``("tuple",
    launch, coop, pdl, arg_annotations, kernel_signature)`` for 3.9's (kernel arguments as
    one tuple after the annotations). Anything else (another backend's launcher, scratch,
    GSan, an unknown layout): None, and the launch goes through ``run(...)`` as before.
    ``tests/test_triton_launch.py`` checks both layouts against Triton's own ``__call__``."""
    cls = type(run)
    if cls.__name__ != "CudaLauncher" or cls.__module__ != "triton.backends.nvidia.driver":
        return None
    try:
        if run.global_scratch_size or run.profile_scratch_size or getattr(run, "gsan_enabled", False):
            return None
        launch, coop, pdl = run.launch, run.launch_cooperative_grid, run.launch_pdl
    except AttributeError:
        return None
    code = cls.__call__.__code__
    params = code.co_varnames[:code.co_argcount]
    if params == ("self", "gridX", "gridY", "gridZ", "stream", "function") and code.co_flags & 0x04:
        if hasattr(run, "arg_annotations"):
            return None  # a layout between the two known ones
        return ("varargs", launch, coop, pdl)
    if params[:10] == ("self", "gridX", "gridY", "gridZ", "stream", "function", "kernel_metadata",
                       "launch_metadata", "launch_enter_hook", "launch_exit_hook") and \
            hasattr(run, "arg_annotations") and hasattr(run, "kernel_signature"):
        return ("tuple", launch, coop, pdl, run.arg_annotations, run.kernel_signature)
    return None


def _pointers_follow_convention(names: list[str], args: tuple) -> bool:
    """Every tensor argument is a ``*_ptr`` parameter and every ``*_ptr`` argument is a
    tensor or None (what :func:`fast_launcher`'s pointer conversion relies on)."""
    import torch

    for name, arg in zip(names, args):
        is_ptr = name.endswith("_ptr")
        if isinstance(arg, torch.Tensor) != is_ptr and not (is_ptr and arg is None):
            return False
    return len(names) == len(args)


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
