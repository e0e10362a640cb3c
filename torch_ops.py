"""The pack's device ops as ``torch.library`` custom ops: ``torch.ops.swa_backends.<op>``.

Importing this module defines the ops (``swa_backends.plugin.register()`` does it for a
serving engine); ``import swa_backends`` alone does not. Every form of every op is generated
by one loop (:func:`define_ops`) from what the op declares once (``swa_backends.common.ops.OPS``):
its signature (the reference's), the schema types of its non-tensor arguments
(``OpSpec.scalars``; an ``int`` becomes ``SymInt``, so a size taken from a dynamic shape
stays symbolic under torch.compile), its result tensors with their shapes (``OpSpec.results``) and the
arguments it writes in place (``OpSpec.mutates``). Each form has a fake kernel built from the
same shapes, so ``torch.compile`` and graph capture trace it without running it; its real
kernel dispatches to :func:`swa_backends.select` for the device of its data tensors (one
``select()`` per device, cached), validated unless validation is off. No op is
differentiable: each runs below autograd, so its outputs never require grad (an input that
requires grad is read, and gets no gradient).

Forms (a custom op may not return one of its inputs, so writes are separate forms that
return nothing and declare what they write):

* ``<op>(...)`` -- the Python op's arguments without ``out=``; returns fresh result tensors
  (none for ``pad_replayed_slots``, which writes ``slot_mappings`` in place, declared);
* ``<op>_out(..., *, out_<result>=...)`` -- the same, writing preallocated buffers (stable
  addresses for graphs), one keyword argument per result tensor (``out`` for ops with one
  result; ``out_indices``/``out_lens``, ``out_indptr``/``out_values``, ``out_rows``, ...);
* a ``ReplayPlan`` (host object) becomes its tensors and sizes in place:
  ``kept, trimmed, dropped_before, num_rows, num_rows_padded`` (the plan's window is ``W``);
  ``prepare_replay_step`` takes a plan optionally, so it has ``_plan`` forms that take them
  after its positional arguments. Pass the plan tensors already on the device inside a
  captured graph (:func:`plan_arguments` with a device copies them once per plan).

Results of ``gather_replay_batch`` come back as ``(rows, query_start_loc, positions,
slot_mappings, kv_start)`` (:func:`replay_batch` makes a :class:`ReplayBatch`);
``prepare_replay_step`` returns ``(replay_start, swa_indices, swa_lens, stale_replay, prefill_swa_indices,
prefill_swa_lens, gather_lens)`` (the last three empty unless ``prefill_from`` /
``gather_lens_from`` ask for them; their ``out_`` buffers may be left out then) and, with a
plan, the five sub-batch tensors after them. :func:`call` runs any op with its Python arguments
(``out=``, plans and all) through these custom ops and returns what the Python op returns.
"""

from __future__ import annotations

import inspect
import string

import torch

from .common.ops import OPS, OpSpec
from .common.types import ReplayBatch, ReplayPlan
from .common.validation import fail
from . import dispatch as _dispatch
from .dispatch import Backend

NAMESPACE = "swa_backends"

#: Every op defined here, functional and out/plan forms.
OP_NAMES: list[str] = []

# A ReplayPlan argument, as tensors and sizes (its window is the op's W).
PLAN_FIELDS = ("kept", "trimmed", "dropped_before", "num_rows", "num_rows_padded")
#: Output order of the tensor-level ``gather_replay_batch`` (the ReplayBatch fields).
REPLAY_BATCH_FIELDS = ("rows", "query_start_loc", "positions", "slot_mappings", "kv_start")
#: Outputs of the tensor-level prepare_replay_step (the PreparedStep tensors; the padded
#: slot_mappings is the mutated input, not an output).
PREPARED_FIELDS = ("replay_start", "swa_indices", "swa_lens", "stale_replay", "prefill_swa_indices", "prefill_swa_lens",
                   "gather_lens")

_lib = torch.library.Library(NAMESPACE, "FRAGMENT")


# ---------------------------------------------------------------------------------------
# dispatch to the selected backend of a device
# ---------------------------------------------------------------------------------------


def backend_for(device: torch.device | str) -> Backend:
    """The backend the ops use for tensors on ``device`` (``dispatch.backend_for``: one
    ``select(device)`` per device and process)."""
    return _dispatch.backend_for(device)


def clear_backends() -> None:
    """Forget the cached backends (after changing the matrix, a fake device, probes...)."""
    _dispatch.clear_backends()


# ---------------------------------------------------------------------------------------
# one form of one op: its schema, and the map between tensor-level and Python arguments
# ---------------------------------------------------------------------------------------


class _Form:
    """A custom op form of ``spec``: ``with_plan`` (a ReplayPlan as its fields),
    ``with_out`` (result buffers as ``out_<name>`` keywords)."""

    def __init__(self, spec: OpSpec, with_plan: bool, with_out: bool):
        self.spec, self.with_plan, self.with_out = spec, with_plan, with_out
        params = [p for p in spec.signature.parameters.values() if p.name != "out"]
        self.plan_required = any(p.name == "plan" and p.default is p.empty for p in params)
        self.py_params = [p for p in params if p.name != "plan"]
        self.name = spec.name + ("_plan" if with_plan and not self.plan_required else "") + ("_out" if with_out else "")
        self.data_arg = next(p.name for p in self.py_params if spec.scalar_type(p.name) == "Tensor")

    def result_names(self) -> tuple[str, ...]:
        return self.spec.results.names_for(self.with_plan and not self.plan_required)

    def out_keywords(self, names) -> list[str]:
        return ["out"] if self.spec.results.out == "tensor" else ["out_" + n.replace(".", "_") for n in names]

    def schema(self) -> str:
        letters = iter(string.ascii_lowercase)
        pos, kw = [], []
        for p in self.py_params:
            if self.plan_required and p.name == self.py_params[0].name and p.kind != p.KEYWORD_ONLY:
                pos += _plan_schema()  # the plan comes first where the Python op takes it first
            text = _param_schema(self.spec, p, next(letters) if p.name in self.spec.mutates else None)
            (kw if p.kind == p.KEYWORD_ONLY else pos).append(text)
        if self.with_plan and not self.plan_required:
            pos += _plan_schema()
        n = len(self.result_names())
        if self.with_out:
            extra = self.spec.results.optional_names  # (their keywords spelled as out_keywords spells them)
            optional = set(self.out_keywords(extra)) if extra else set()
            kw = [f"Tensor({next(letters)}!)? {k}=None" if k in optional else f"Tensor({next(letters)}!) {k}"
                  for k in self.out_keywords(self.result_names())] + kw
            returns = "()"
        else:
            returns = "()" if n == 0 else ("Tensor" if n == 1 else "(" + ", ".join(["Tensor"] * n) + ")")
        return f"({', '.join(pos + (['*'] + kw if kw else []))}) -> {returns}"

    def python_args(self, args: tuple, kwargs: dict) -> tuple[dict, dict]:
        """``(arguments of the Python op, out buffers by result name)`` from a tensor-level call."""
        names = [p.name for p in self.py_params if p.kind != p.KEYWORD_ONLY]
        args = list(args)
        values: dict = {}
        plan_vals = None
        if self.with_plan and self.plan_required:
            plan_vals, args = args[:len(PLAN_FIELDS)], args[len(PLAN_FIELDS):]
        for name in names:
            if args:
                values[name] = args.pop(0)
        if self.with_plan and not self.plan_required:
            plan_vals = args[:len(PLAN_FIELDS)]
        for p in self.py_params:
            if p.name not in values:
                values[p.name] = kwargs.get(p.name, p.default if p.default is not p.empty else None)
        if plan_vals is not None:
            values["plan"] = ReplayPlan(*plan_vals, window=values["W"])
        out = {}
        if self.with_out:
            names = self.result_names()
            out = dict(zip(names, (kwargs.get(k) for k in self.out_keywords(names))))
        return values, out


def _schema_type(t: str) -> str:
    """``SymInt`` for a declared ``int``: a size torch.compile keeps dynamic (the token count of
    ``hidden.shape[0]`` passed as ``num_rows``/``num_tokens``) stays symbolic instead of being
    specialised -- with ``int``, ``mark_dynamic`` raised ConstraintViolationError and
    ``dynamic=True`` compiled one graph per size. Eager calls still hand the kernel a Python
    int (the pack's validation requires ``x.__class__ is int``); only fake kernels see SymInts."""
    return {"int": "SymInt", "int?": "SymInt?"}.get(t, t)


def _param_schema(spec: OpSpec, p: inspect.Parameter, alias: str | None) -> str:
    t = _schema_type(spec.scalar_type(p.name))
    if alias is not None:
        return f"Tensor({alias}!) {p.name}"
    if p.default is p.empty:
        return f"{t} {p.name}"
    if p.default is None:
        return f"{t}? {p.name}=None"
    if isinstance(p.default, str):
        return f'{t} {p.name}="{p.default}"'
    return f"{t} {p.name}={p.default}"


def _plan_schema() -> list[str]:
    return ["Tensor kept", "Tensor trimmed", "Tensor dropped_before", "SymInt num_rows", "SymInt num_rows_padded"]


# ---------------------------------------------------------------------------------------
# the one loop that defines every form
# ---------------------------------------------------------------------------------------


def _fresh(outputs: tuple, inputs) -> tuple:
    """Outputs of a functional custom op must not alias its inputs: clone any output a
    variant returned that shares storage with an argument (a copy-through fast path)."""
    ptrs = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor) and t.numel()}
    return tuple(t.clone() if t.numel() and t.untyped_storage().data_ptr() in ptrs else t for t in outputs)


def _not_differentiable(op: torch._ops.OpOverload):
    """The op's Autograd kernel: no op here has a derivative (indices, lengths, copies of rows,
    an attention forward without its backward), so it runs below autograd and its outputs do
    not require grad. Without it the CompositeExplicitAutograd kernel ran with grad mode on:
    an output could come back with a grad_fn from the reference's internals (sparse_mla) or
    with requires_grad=True, and backward then gave the inputs nothing."""

    # (rather than raising when an input requires grad: opcheck's schema and AOT tests run the
    # op on such inputs, and only this form passes them -- torch.library's advice for an op
    # that is not differentiable). Re-invoking the op costs one more dispatch in grad mode (less than
    # redispatching with the keyset); inference_mode skips this kernel.
    def kernel(*args, **kwargs):
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args, **kwargs)

    return kernel


def _data(form: _Form, values: dict) -> torch.Tensor:
    """The form's first tensor argument, whose device picks the backend (torch hands a Python
    kernel None for a ``Tensor`` argument passed as None: the Python op's error, not an AttributeError)."""
    t = values[form.data_arg]
    if not isinstance(t, torch.Tensor):
        fail(form.spec.name, form.data_arg, t, "a torch.Tensor")
    return t


def _all_meta_or_none(form: _Form, like: torch.Tensor, values: dict, out: dict) -> None:
    """The fake kernel is also the op's Meta kernel, which torch's dispatcher runs for a call with
    any meta tensor: shapes only for a call whose tensors are all meta (a trace), a ``ValueError``
    for one that mixes meta with real tensors (it returned uninitialised host memory as results,
    and wrote no ``out_`` buffer). Under FakeTensorMode every tensor reports its fake device."""
    meta = like.device.type == "meta"
    plan = values.get("plan")
    tensors = [*values.items(), *zip(form.out_keywords(list(out)), out.values())]
    if plan is not None and not meta:  # (a plan's tensors are host tensors, with a meta trace's data too)
        tensors += [(n, getattr(plan, n)) for n in PLAN_FIELDS[:3]]
    for name, t in tensors:
        if isinstance(t, torch.Tensor) and (t.device.type == "meta") != meta:
            fail(form.spec.name, name, t, f"device {like.device} (same as {form.data_arg}: the custom ops take a meta "
                                          "tensor only in a call whose every tensor is meta, shapes only)")


def _define(form: _Form) -> None:
    spec = form.spec

    def impl(*args, **kwargs):
        values, out = form.python_args(args, kwargs)
        device = _data(form, values).device
        positional = [values[p.name] for p in form.py_params if p.kind != p.KEYWORD_ONLY]
        keywords = {p.name: values[p.name] for p in form.py_params if p.kind == p.KEYWORD_ONLY}
        if "plan" in values:
            if form.plan_required:
                positional = [values["plan"], *positional]
            else:
                keywords["plan"] = values["plan"]
        if form.with_out:
            keywords["out"] = spec.results.out_structure(out)
        res = getattr(backend_for(device), spec.name)(*positional, **keywords)
        if form.with_out:
            return None
        names = form.result_names()
        if not names:  # an in-place op: its writes are declared in the schema
            return None
        tensors = spec.results.from_python(res, names)
        if any(t is None for t in tensors):  # optional results not asked for: empty, shaped as declared
            shapes = list(spec.results.shapes(values).values())
            tensors = tuple(torch.empty(shapes[i][0], dtype=shapes[i][1], device=device) if t is None else t
                            for i, t in enumerate(tensors))
        fresh = _fresh(tensors, [*args, *kwargs.values()])
        return fresh[0] if len(fresh) == 1 else fresh

    def fake(*args, **kwargs):
        values, out = form.python_args(args, kwargs)
        like = _data(form, values)
        _all_meta_or_none(form, like, values, out)
        if form.with_out or not form.result_names():
            return None
        outs = []
        for shape, dtype in spec.results.shapes(values).values():
            shape = tuple(torch.library.get_ctx().new_dynamic_size() if s is None else s for s in shape)
            outs.append(torch.empty(shape, dtype=dtype, device=like.device))
        return outs[0] if len(outs) == 1 else tuple(outs)

    _lib.define(form.name + form.schema())
    _lib.impl(form.name, impl, "CompositeExplicitAutograd")
    _lib.impl(form.name, _not_differentiable(getattr(getattr(torch.ops, NAMESPACE), form.name).default),
              "Autograd")
    torch.library.register_fake(f"{NAMESPACE}::{form.name}", fake, lib=_lib)
    OP_NAMES.append(form.name)


def _forms(spec: OpSpec) -> list[_Form]:
    params = spec.signature.parameters
    optional_plan = "plan" in params and params["plan"].default is not inspect.Parameter.empty
    plans = (False, True) if optional_plan else ((True,) if "plan" in params else (False,))
    outs = (False, True) if "out" in params and spec.results.out is not None else (False,)
    return [_Form(spec, p, o) for p in plans for o in outs]


FORMS: dict[str, _Form] = {}


def define_ops() -> list[str]:
    """Define every form of every op in ``OPS`` not defined yet (at import: all of them; after
    ``register_op``: the new op's). Returns the forms it defined."""
    made = []
    for spec in OPS.values():
        for form in _forms(spec):
            if form.name not in FORMS:
                _define(form)
                FORMS[form.name] = form
                made.append(form.name)
    return made


define_ops()


def qualified_names() -> list[str]:
    """``swa_backends::<op>`` for every op defined here."""
    return [f"{NAMESPACE}::{n}" for n in OP_NAMES]


# ---------------------------------------------------------------------------------------
# calling the ops with the Python API's arguments
# ---------------------------------------------------------------------------------------


def plan_arguments(plan: ReplayPlan, device=None) -> tuple:
    """``(kept, trimmed, dropped_before, num_rows, num_rows_padded)`` of a host plan, as the
    tensor-level ops take it. With ``device``, the tensors are copied there once per plan
    and device (graph capture)."""
    if not isinstance(plan, ReplayPlan):
        raise ValueError(f"gather_replay_batch: plan={plan!r}: expected a ReplayPlan from plan_replay_batch")
    if device is None:
        return plan.kept, plan.trimmed, plan.dropped_before, plan.num_rows, plan.num_rows_padded
    dev = torch.device(device)
    dropped = plan.device_dropped_before(dev)
    copies = plan._device_cache.get(f"kept,trimmed:{dev}")
    if copies is None:
        copies = plan._device_cache[f"kept,trimmed:{dev}"] = (plan.kept.to(dev), plan.trimmed.to(dev))
    return copies[0], copies[1], dropped, plan.num_rows, plan.num_rows_padded


def replay_batch(outputs, num_rows: int) -> ReplayBatch:
    """The five outputs of the tensor-level ``gather_replay_batch`` as a :class:`ReplayBatch`."""
    fields = dict(zip(REPLAY_BATCH_FIELDS, outputs))
    return ReplayBatch(num_rows=int(num_rows), num_rows_padded=int(fields["rows"].shape[0]), **fields)


def lower(op: str, *args, **kwargs):
    """The custom op form and its arguments for a call of the Python op ``op``:
    ``(torch op, args, kwargs, finish)``, where ``finish(result)`` turns what the custom op
    returns into what the Python op returns (the ``out=`` buffers, the mutated
    ``slot_mappings``, a ReplayBatch, a PreparedStep)."""
    spec = OPS[op]
    try:
        bound = spec.signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise ValueError(f"{op}: arguments {exc}") from None
    values = dict(bound.arguments)
    for p in spec.signature.parameters.values():
        values.setdefault(p.name, p.default if p.default is not p.empty else None)
    plan, out = values.get("plan"), values.get("out")
    if "plan" in spec.signature.parameters and plan is not None and not isinstance(plan, ReplayPlan):
        raise ValueError(f"{op}: plan={plan!r}: expected a ReplayPlan from plan_replay_batch")
    form = FORMS[op + ("_plan" if plan is not None and "plan" not in _required(spec) else "")
                 + ("_out" if out is not None else "")]
    positional = []
    if plan is not None and form.plan_required:
        positional += plan_arguments(plan)
    positional += [values[p.name] for p in form.py_params if p.kind != p.KEYWORD_ONLY]
    if plan is not None and not form.plan_required:
        positional += plan_arguments(plan)
    keywords = {p.name: values[p.name] for p in form.py_params if p.kind == p.KEYWORD_ONLY}
    names = form.result_names()
    fn = getattr(torch.ops.swa_backends, form.name)
    if out is not None:
        if not isinstance(out, {"tensor": torch.Tensor, "tuple": tuple, "dict": dict}[spec.results.out]):
            raise ValueError(f"{op}: out={out!r}: expected a {spec.results.out} of buffers")
        buffers = spec.results.out_buffers(out, names)
        keywords |= dict(zip(form.out_keywords(names), buffers.values()))
        return fn, tuple(positional), keywords, lambda _: spec.results.to_python(buffers, values)

    def finish(res):
        tensors = (res,) if isinstance(res, torch.Tensor) else tuple(res or ())
        return spec.results.to_python(dict(zip(names, tensors)), values)

    return fn, tuple(positional), keywords, finish


def call(op: str, *args, **kwargs):
    """Run the pack's op ``op`` through ``torch.ops.swa_backends`` with the arguments of its
    Python form (``backend.<op>``, ``OPS[op].reference``): picks the functional, ``_out``
    or plan form, unpacks a ReplayPlan, and returns what the Python op returns."""
    fn, a, kw, finish = lower(op, *args, **kwargs)
    return finish(fn(*a, **kw))


def _required(spec: OpSpec) -> set[str]:
    return {p.name for p in spec.signature.parameters.values() if p.default is p.empty}
