"""How the pack launches its Triton kernels: one path, Triton's own launcher.

``Kernel(key, grid, *args)``: the first launch of a specialisation ``key`` goes through
Triton's ``kernel[grid](*args)`` (bind, specialise, compile or load from Triton's cache,
launch). Triton returns the compiled kernel, which :class:`Kernel` keeps under ``(device,
key)``; later launches of that key call the compiled kernel's own launcher
(``CompiledKernel.run``, Triton's code) with the same arguments ``JITFunction.run`` passes it,
profiler launch hooks included. What that skips is Triton's per-call binding and
specialisation, much of a small launch's host time (a whole ``gather_replay_batch`` call
through each path: bench/README.md, "Metadata kernels" under "What was tried and measured").

Skipping it is sound only because the pack's key fixes everything Triton specialises on:
:func:`jit` declares every runtime ``int`` parameter ``do_not_specialize`` and every pointer
``do_not_specialize_on_alignment`` (except those named in ``align=``, whose alignment the
caller puts into the key), so Triton's specialisation depends only on the argument dtypes and
the constexprs, which each op's launcher puts into its key, and on the width Triton gives
each ``int`` (i32 below 2**31, i64 from it): validation keeps every int a kernel takes below
2**31, tensor sizes and strides included (SPEC §0 Limits), so that width is always i32 and
the key need not carry it (an int that is an address, as ``kernels/value_read.py`` passes its
pieces, is annotated ``tl.int64``, which Triton takes as its type whatever its value). A kernel that keeps Triton's own specialisation (the sparse-MLA
``triton.jit`` and ``gluon.jit`` kernels) launches through :func:`launch_meta`, whose key adds
:func:`specialization` of the arguments, at least as fine as Triton's. ``check_keys`` (tests)
sends every launch through Triton's path and fails when one key maps to two compiled kernels.

Below ``CompiledKernel.run`` sits the kernel's C launcher (``run.launch``, Triton's
generated code: it reads each tensor's address and launches). Where calling it directly is
*exactly* what ``run`` would do -- ``run``'s ``__call__`` is a body this module knows, by the
hash of its source text (:data:`DIRECT_LAUNCHERS`: Triton 3.6's, which forwards every
argument after two scratch buffers it allocates only when the kernel declares scratch), the
kernel declares none, and no launch hook is set -- :class:`Kernel` calls the C launcher
itself, sparing ``CompiledKernel.run``'s Python. It passes each tensor argument as its address
(``data_ptr()``): for a tensor the C launcher reads the address and asks the driver whether
it is device memory (``cuPointerGetAttribute``), a query per pointer that costs more than
reading the addresses in Python. Both were measured on a ``prepare_replay_step`` launch
(``bench/experiments/exp_launch_cost.py``, ``bench/results/h200/exp_launch_cost.json``;
bench/README.md, "The launch was what was left at the single-prefill steps"). That query
catches only a host tensor (memory of another GPU passes it); the pack's validation checks
every tensor's device (each against one of the call's, that one against the backend's:
``dispatch.home_device``), and a caller that turns validation off vouches for its inputs, as for
their sizes.
Any other Triton, a kernel with scratch, or a hook set: ``CompiledKernel.run``, as before.

Which path each Triton gets (:func:`launch_path`): Triton 3.6 (the H200 machine's, torch 2.11)
the C launcher; Triton 3.8 (vLLM 0.33's, through its torch 2.14 pin) and 3.9
``CompiledKernel.run``: their launcher bodies were read (:data:`READ_LAUNCHERS`) and hand the
arguments to a generic C launcher in another layout (the kernel's arguments as one tuple after
its argument annotations and signature bytes, the scratch buffers after the hooks) and, with
Triton's gsan instrumentation on, add a state pointer and synchronise the stream, so the 3.6
call would be wrong there. ``CompiledKernel.run`` itself is called as ``JITFunction.run`` calls
it, which ``tests/kernels/test_triton_launch.py`` checks in the source of the Triton it runs
under, the vLLM CI stage's 3.8 included.

Under the interpreter (``TRITON_INTERPRET=1``) Triton returns no compiled kernel, so every
launch takes Triton's path. Nothing here decorates a kernel or reads the environment.
"""

from __future__ import annotations

import functools
import hashlib
import inspect

import torch
import triton

#: Every (kernel name, key) launched in this process: warmup tests compare it before and
#: after a serving-like call.
LAUNCHED: set[tuple[str, tuple]] = set()
KERNELS: dict[str, "Kernel"] = {}
#: Tests: every launch through Triton's own path, asserting that a key maps to one compiled kernel.
check_keys = False
#: SHA-256 of the whitespace-free source of a ``CompiledKernel.run.__call__`` whose body is
#: ``launch(gridX, gridY, gridZ, stream, function, launch_cooperative_grid, launch_pdl,
#: global_scratch, profile_scratch, *args)`` with both scratch buffers None when their
#: declared sizes are 0 (its ``args``: packed metadata, launch metadata, the two hooks, the
#: kernel's arguments). Triton 3.6.0's ``CudaLauncher``.
DIRECT_LAUNCHERS: frozenset[str] = frozenset({"0ff2b3219ec9f5067def7f5b72cf4ed0f1b544e98655c5e548c7e933e3ab3a19"})
#: Launcher bodies (the same hash) read and found *not* to be that one: their kernels take
#: ``CompiledKernel.run``. Each hands Triton's one generic C launcher ``launch(grid, stream,
#: function, cooperative grid, PDL, packed metadata, launch metadata, hooks, global scratch,
#: profile scratch, argument annotations, signature bytes, the arguments as one tuple)`` (the
#: HIP one: the cooperative flag first, the scratch buffers before the metadata, the warp size
#: before the annotations, no PDL); under the gsan instrumentation the CUDA ones add arguments
#: and synchronise the stream after the launch.
READ_LAUNCHERS: dict[str, str] = {
    "07cb65bca80ed204492b71f9004d9c488498ad407504aa4aed61cf1349755e37": "Triton 3.8.0 CudaLauncher",
    "b3d689acc085368a2b47eb1106ae1225f912073e5d1786ab7f309ae6f5318de3": "Triton 3.9.0 CudaLauncher",
    "dc25841e547b92a64376ec3e52e3b26519c8fdff61c4bca50f9d81a20ff80fab": "Triton 3.8.0 / 3.9.0 HIPLauncher",
}
_known_calls: dict[type, bool] = {}


def launcher_hash(cls) -> str:
    """SHA-256 of the whitespace-free source of a launcher class's ``__call__`` ("" when it
    has no readable source)."""
    try:
        src = inspect.getsource(cls.__call__)
    except (OSError, TypeError):
        return ""
    return hashlib.sha256("".join(src.split()).encode()).hexdigest()


def launch_path(cls) -> tuple[str, str]:
    """``(path, why)`` for a compiled kernel's launcher class (``driver.active.launcher_cls``):
    ``"direct"`` (its C launcher, called as Triton 3.6's body calls it), ``"run"`` (a body
    read and found different: ``CompiledKernel.run``) or ``"unread"`` (a body nobody has
    compared: ``CompiledKernel.run`` too, unverified)."""
    h = launcher_hash(cls)
    if h in DIRECT_LAUNCHERS:
        return "direct", f"{cls.__name__} body {h[:12]} is Triton 3.6's"
    if h in READ_LAUNCHERS:
        return "run", f"{READ_LAUNCHERS[h]} (body {h[:12]}): read, another calling convention"
    return "unread", f"{cls.__name__} body {h[:12] or '(no source)'}: not compared with Triton 3.6's"


def direct_launch(ck):
    """``(launch, function, launch_cooperative_grid, launch_pdl, packed_metadata)`` of a
    compiled kernel whose C launcher can be called in place of ``ck.run`` (see the module
    docstring), else None."""
    run = getattr(ck, "run", None)
    launch = getattr(run, "launch", None)
    if launch is None:
        return None
    cls = type(run)
    known = _known_calls.get(cls)
    if known is None:
        known = _known_calls[cls] = launcher_hash(cls) in DIRECT_LAUNCHERS
    if not known or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    return launch, ck.function, run.launch_cooperative_grid, run.launch_pdl, ck.packed_metadata


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


def _hook(h):
    """A launch hook as the launcher should get it: None when there is nothing to call
    (Triton 3.9 keeps an empty ``HookChain`` there, never None: passing it would build the
    launch metadata and call two empty chains on every launch)."""
    if h is None or (getattr(h, "calls", None) is not None and not h.calls):
        return None
    return h


class Kernel:
    """A Triton kernel plus the pack's cache of its compiled specialisations.

    ``kernel(key, grid, *args)``: ``key`` a hashable tuple that determines Triton's
    specialisation (constexprs + varying dtypes + declared alignments, and any compile
    option ``options`` reads from it), ``grid`` a 3-tuple, ``args`` every kernel parameter in
    order, constexprs included. ``options``: ``key -> {compile option: value}`` (e.g.
    ``num_warps``) for the launch that compiles a key; None: Triton's defaults. ``by_name``:
    the last parameters, which the first launch of a key passes by keyword: a Gluon kernel
    declares ``num_warps`` as a constexpr parameter, and Triton takes the compile option of
    that name only from a keyword.
    """

    __slots__ = ("fn", "name", "options", "by_name", "launches", "_compiled", "_direct", "_runtime")

    def __init__(self, fn, name: str | None = None, options=None, by_name: tuple[str, ...] = ()):
        self.fn = fn
        self.options = options
        self.by_name = tuple(by_name)
        inner = getattr(fn, "fn", fn)
        self.name = name or f"{inner.__module__.rsplit('.', 1)[-1]}.{inner.__qualname__}"
        self.launches = 0  # every launch of this kernel in this process (tests count them)
        self._compiled: dict = {}
        self._direct: dict = {}  # (device, key) -> direct_launch(compiled) where it applies
        self._runtime = None  # (device getter, stream getter, Triton's runtime knobs, its HookChain class or None)
        KERNELS[self.name] = self

    def __call__(self, key: tuple, grid: tuple, *args) -> None:
        self.launches += 1
        rt = self._runtime
        if rt is not None and not check_keys:
            get_device, get_stream, knobs, chain = rt
            dev = get_device()
            slot = (dev, key)
            direct = self._direct.get(slot)
            if direct is not None:
                enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
                # no hook set: None, or an empty hook chain (Triton 3.6 keeps one in each knob)
                if ((enter is None or enter.__class__ is chain and not enter.calls)
                        and (leave is None or leave.__class__ is chain and not leave.calls)):
                    launch, function, coop, pdl, packed, tensors = direct
                    a = list(args)
                    for i in tensors:  # an address goes through as it is: no driver query (module docstring)
                        a[i] = a[i].data_ptr()
                    launch(*grid, get_stream(dev), function, coop, pdl, None, None, packed, None, None, None, *a)
                    return
            ck = self._compiled.get(slot)
            if ck is not None:
                stream = get_stream(dev)
                enter, leave = _hook(knobs.launch_enter_hook), _hook(knobs.launch_exit_hook)
                meta = ck.launch_metadata(grid, stream, *args) if enter is not None or leave is not None else None
                ck.run(grid[0], grid[1], grid[2], stream, ck.function, ck.packed_metadata, meta, enter, leave, *args)
                return
        self._first(key, grid, args)

    def _first(self, key: tuple, grid: tuple, args: tuple) -> None:
        kwargs = self.options(key) if self.options is not None else {}
        if self.by_name:
            n = len(self.by_name)
            kwargs = {**kwargs, **dict(zip(self.by_name, args[-n:]))}
            ck = self.fn[grid](*args[:-n], **kwargs)
        else:
            ck = self.fn[grid](*args, **kwargs)
        LAUNCHED.add((self.name, key))
        if ck is None or not hasattr(ck, "packed_metadata"):  # the interpreter compiles nothing
            return
        if self._runtime is None:
            from triton.knobs import runtime
            from triton.runtime import driver

            get_device = driver.active.get_current_device
            if get_device is torch.cuda.current_device and hasattr(torch._C, "_cuda_getDevice"):
                # what it returns once CUDA is initialised (a kernel has just run), without
                # its lazy-initialisation check: measured cheaper than torch.cuda.current_device
                # (bench/README.md, "The launch was what was left at the single-prefill steps")
                get_device = torch._C._cuda_getDevice
            try:
                from triton.knobs import HookChain
            except ImportError:  # a Triton whose hook knobs hold plain callables
                HookChain = None
            self._runtime = (get_device, driver.active.get_current_stream, runtime, HookChain)
        slot = (self._runtime[0](), key)
        known = self._compiled.setdefault(slot, ck)
        if known is ck and slot not in self._direct:
            direct = direct_launch(ck)
            if direct is not None:
                # the key fixes which arguments are tensors (a None is a specialisation of its own)
                self._direct[slot] = (*direct, tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor)))
        if check_keys and known is not ck:
            raise AssertionError(
                f"{self.name}: launch key {key} maps to two compiled kernels; the key misses a specialisation")

    def compiled(self) -> int:
        """Number of compiled variants Triton holds for this kernel (all devices)."""
        caches = getattr(self.fn, "device_caches", None)
        return sum(len(entry[0]) for entry in caches.values()) if caches else 0


def specialization(args) -> tuple:
    """A launch key part at least as fine as what Triton specialises a kernel's runtime arguments on,
    for a kernel whose parameters keep Triton's defaults (:func:`jit` declares them otherwise):
    per tensor its dtype and whether its address is 16-byte aligned, per ``int`` whether it is 1,
    whether 16 divides it and whether it needs 64 bits, per other value its type (a float's value
    is not specialised on). Finer than Triton's where a parameter is ``do_not_specialize``: more
    keys, each still mapping to one compiled kernel."""
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append((a.dtype, a.data_ptr() % 16 == 0))
        elif a.__class__ is int:
            key.append((a == 1, a % 16 == 0, not -2**31 <= a < 2**31))
        else:
            key.append(a.__class__)
    return tuple(key)


_BY_META: dict = {}


def _meta_kernel(fn) -> tuple[Kernel, tuple[str, ...], tuple, dict]:
    """The :class:`Kernel` over a JIT function launched by :func:`launch_meta`, the names of
    its constexpr parameters (its last ones), their defaults and the constexpr values made of
    each meta so far (by its items), made on first use."""
    got = _BY_META.get(fn)
    if got is None:
        # the signature, not fn.params: the interpreter's function has none
        params = list(inspect.signature(getattr(fn, "fn", fn)).parameters.values())
        names = tuple(p.name for p in params if "constexpr" in str(p.annotation))
        if tuple(p.name for p in params[len(params) - len(names):]) != names:
            raise TypeError(f"launch_meta: {fn}: its constexpr parameters must come last")
        defaults = tuple(p.default for p in params[len(params) - len(names):])
        got = _BY_META[fn] = (Kernel(fn, options=functools.partial(_compile_options, frozenset(names)),
                                     by_name=names), names, defaults, {})
    return got


def _compile_options(names: frozenset, key: tuple) -> dict:
    """The compile options in a :func:`launch_meta` key: its meta's items that are no parameter."""
    return {k: v for k, v in key[0] if k not in names}


def launch_meta(fn, grid: tuple, args: tuple, meta: dict) -> None:
    """Launch a JIT function whose parameters keep Triton's specialisation (a ``triton.jit`` or
    ``gluon.jit`` kernel, not :func:`jit`'s) as ``fn[grid](*args, **meta)`` would, through
    :class:`Kernel`: ``args`` its runtime arguments in order, ``meta`` its constexprs by name
    (one left out takes its default) and its compile options (``num_warps``, ...). The key is
    the meta's items and :func:`specialization` of ``args``, so a launch after a key's first
    calls the compiled kernel's launcher, without Triton's per-call binding (bench/README.md,
    "The default call's host time")."""
    k, names, defaults, made = _meta_kernel(fn)
    items = tuple(meta.items())
    consts = made.get(items)
    if consts is None:  # a meta not seen before: its constexprs in order, once
        values = []
        for name, default in zip(names, defaults):
            value = meta.get(name, default)
            if value is inspect.Parameter.empty:
                raise TypeError(f"launch_meta: {k.name}: constexpr {name} has no value and no default")
            values.append(value)
        consts = made[items] = tuple(values)
    k((items, specialization(args)), (*grid, 1, 1)[:3], *args, *consts)


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
