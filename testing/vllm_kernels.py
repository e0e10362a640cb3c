"""vLLM's replay-metadata kernels, for the differential against the pack.

``load()`` takes "vLLM's kernels" from one of two places:

* ``SWA_VLLM_KERNELS_DIR=<dir>`` (or ``load(source=dir)``): copies of vLLM's source files,
  for a machine without vLLM (a GPU box: vLLM's wheel cannot travel there). ``<dir>`` holds
  ``model_state.py`` (``vllm/models/deepseek_v41/nvidia/model_state.py``) and ``sparse_swa.py``
  (``vllm/v1/attention/backends/mla/sparse_swa.py``), flat or under those relative paths
  (with or without the leading ``vllm/``). Only the four ``@triton.jit`` functions are taken
  out of the files (``ast``), written to one temporary module and compiled by the installed
  Triton; the rest of each file, which imports vLLM, is never run. What is taken does run
  (decorators, default arguments), so the folder, the folders on the way to each file and
  the files (a symlink: its target) must be this user's (or root's) and writable by no one
  else: another's is refused with the path and the reason.
* the installed vLLM (``vllm`` importable): the module attributes themselves (a shim of the
  integration's patches is looked through to vLLM's original).

Which files, which functions and how vLLM's call sites launch them are the release's (its
subpackage's ``kernels`` module, ``swa_backends.integrations.vllm.v0_33.kernels``): the
installed vLLM's release, else the newest supported one (``current_release()``; a copy's
folder holds that release's files). Its launch functions (``pad_replayed_slots``,
``swa_indices_and_lens``, ``prefill_gather_lens``, ``gather_replay_batch``), ``PAD_SLOT_ID`` and
tables read through this module, so a differential needs nothing else from vLLM.

``load_launchers()`` gives what vLLM's call sites really call (a step's host time depends on
it): the two sparse-SWA kernels through vLLM's own launch objects (``VllmTritonJitKernel``
subclasses: each call binds its arguments with ``inspect`` and maps them onto the kernel's
before ``kernel[grid](**kwargs)``), and the model state's two ``@triton.jit`` functions,
launched as ``kernel[grid](...)``. From the installed vLLM those are its module globals; from
copies of the source files, the same classes and functions are taken out of the release's
files (``ast``, as above) and defined after its prelude (a small base standing in for
``VllmJitKernel``, vLLM's one-line helpers restated): every line a launch runs is vLLM's.
"""

from __future__ import annotations

import ast
import os
import stat
import textwrap
from dataclasses import dataclass
from pathlib import Path

import torch

ENV = "SWA_VLLM_KERNELS_DIR"
#: what the release's ``kernels`` module defines that reads through this one
FROM_RELEASE = ("FILES", "KERNELS", "LAUNCH_SOURCES", "PAD_SLOT_ID", "pad_replayed_slots", "swa_indices_and_lens",
                "prefill_gather_lens", "gather_replay_batch")


def release_kernels():
    """The release's ``kernels`` module: the installed vLLM's release, else the newest supported."""
    from ..integrations.vllm import current_release

    return current_release().kernels


def __getattr__(name: str):
    if name in FROM_RELEASE:
        return getattr(release_kernels(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class VllmKernels:
    pad: object
    gather: object
    swa: object
    prefill: object
    origin: str


class UntrustedSourceError(PermissionError):
    """A folder or file of vLLM's sources that another user can write: the code taken out of
    it would run in this process."""


def _user(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _check_owned(path: Path) -> None:
    """Refuse ``path`` unless what it names (a symlink's target) is this user's or root's and
    writable by neither its group nor others: anyone else could put code there that runs here
    when the copies are loaded (the project's rule: nothing is loaded from a place another user
    can write)."""
    geteuid = getattr(os, "geteuid", None)
    if geteuid is None:  # no POSIX owners (Windows): nothing to compare
        return
    real = Path(os.path.realpath(path))
    named = f"{path} (-> {real})" if real != Path(os.path.abspath(path)) else str(path)
    st = real.stat()
    me = geteuid()
    if st.st_uid not in (me, 0):  # root's: as trusted as the interpreter itself
        allowed = f"this user ({_user(me)})" + (" or root" if me else "")
        raise UntrustedSourceError(f"{named} is owned by {_user(st.st_uid)}, not by {allowed}: code taken from it "
                                   "would run here; use a copy of your own")
    if st.st_mode & 0o022:
        who = " and ".join(w for bit, w in ((0o020, "its group"), (0o002, "others")) if st.st_mode & bit)
        shared = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX  # /tmp and its kind: everyone's by design
        fix = "use a folder of your own" if shared else f"chmod go-w {real}"
        raise UntrustedSourceError(f"{named} is writable by {who} (mode {st.st_mode & 0o7777:o}): code taken from "
                                   f"it would run here; {fix}")


def _find(root: Path, name: str, files: dict[str, str]) -> Path | None:
    """The copy of ``name`` under ``root``, checked (:func:`_check_owned`) with every folder
    on the way to it, or None."""
    rel = files[name]
    for cand in (root / name, root / rel, root / "vllm" / rel):
        if cand.is_file():
            folder = root
            for part in cand.relative_to(root).parts[:-1]:
                folder = folder / part
                _check_owned(folder)
            _check_owned(cand)
            _check_owned(Path(os.path.realpath(cand)).parent)  # a symlinked file: where it lives
            return cand
    return None


def _extract(path: Path, qualname: str) -> str:
    """The source of a (possibly class-nested) function, decorators included, minus
    ``@staticmethod``; or of a class (a dotted ``qualname`` ending in a class), as it is."""
    text = path.read_text()
    tree = ast.parse(text)
    parts = qualname.split(".")
    body = tree.body
    node = None
    for i, part in enumerate(parts):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        if node is None:
            raise LookupError(f"{qualname} not found in {path}")
        body = node.body
    lines = text.splitlines()
    first = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
    src = textwrap.dedent("\n".join(lines[first: node.end_lineno]))
    if isinstance(node, ast.ClassDef):
        return src
    return "\n".join(ln for ln in src.splitlines() if ln.strip() != "@staticmethod")


def _module_from(parts: list[str], name: str):
    """``parts`` written to one module file and imported (Triton compiles a ``@jit`` function
    from its file's source, so an ``exec`` of a string will not do)."""
    import importlib.util
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="swa_vllm_kernels_"))
    module_path = folder / f"{name}.py"
    module_path.write_text("\n".join(parts))
    spec = importlib.util.spec_from_file_location(f"swa_{name}", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _source_of(root: Path, fname: str, qualname: str, files: dict[str, str]) -> list[str]:
    path = _find(root, fname, files)
    if path is None:
        raise FileNotFoundError(f"{fname} (vllm/{files[fname]}) not under {root}")
    return [f"# {path}: {qualname}", _extract(path, qualname), "", ""]


def _installed(target: str):
    """The installed vLLM's object at ``"module:qualname"``, vLLM's own (a patch's shim there
    looked through)."""
    import importlib

    module, qualname = target.split(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return getattr(obj, "_swa_original", obj)


def _vllm_origin() -> str:
    import vllm

    return f"installed vllm {getattr(vllm, '__version__', '?')}"


def _from_source(root: Path, rk) -> VllmKernels:
    """The four kernels' sources, written to one module file and imported."""
    parts = ["import triton", "import triton.language as tl", ""]
    names = {}
    for key, (fname, qualname) in rk.KERNELS.items():
        parts += _source_of(root, fname, qualname, rk.FILES)
        names[key] = qualname.split(".")[-1]
    module = _module_from(parts, "vllm_replay_kernels")
    return VllmKernels(**{key: getattr(module, name) for key, name in names.items()},
                       origin=f"source files under {root}")


def _from_installed(rk) -> VllmKernels:
    return VllmKernels(**{key: _installed(target) for key, target in rk.INSTALLED_KERNELS.items()},
                       origin=_vllm_origin())


def load(source: str | os.PathLike | None = None) -> tuple[VllmKernels | None, str]:
    """``(kernels, where from)`` or ``(None, why not)``."""
    return _load(source, _from_source, _from_installed, lambda rk: [f for f, _ in rk.KERNELS.values()])


def _load(source, from_source, installed, files_of) -> tuple:
    """``from_source(folder, release kernels)`` when ``source`` or ``$SWA_VLLM_KERNELS_DIR`` names
    one, else ``installed(release kernels)`` when vLLM is: ``(result, its origin)``, or
    ``(None, why not)``; ``files_of(release kernels)``: the files a copy needs."""
    source = source or os.environ.get(ENV)
    if source:
        try:
            rk = release_kernels()
            # every copy is checked before code is taken out of any (each file is again when read)
            _check_owned(Path(source))
            for name in dict.fromkeys(files_of(rk)):
                _find(Path(source), name, rk.FILES)
            k = from_source(Path(source), rk)
            return k, k.origin
        except Exception as exc:  # noqa: BLE001
            return None, f"{ENV}={source}: {type(exc).__name__}: {exc}"
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        files = ", ".join(dict.fromkeys(files_of(release_kernels())))
        return None, f"vLLM is not installed and {ENV} is not set (copies of vLLM's {files})"
    try:
        k = installed(release_kernels())
        return k, k.origin
    except Exception as exc:  # noqa: BLE001
        return None, f"vLLM's kernels did not import: {type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class VllmLaunchers:
    """What vLLM's replay-metadata call sites call: ``pad[(num_reqs,)](...)`` and
    ``gather[(num_reqs,)](...)`` (``@triton.jit`` functions), ``swa(...)`` and ``prefill(...)``
    (vLLM's ``VllmTritonJitKernel`` launch objects, called with the builders' arguments)."""

    pad: object
    gather: object
    swa: object
    prefill: object
    origin: str


def _launchers_from_source(root: Path, rk) -> VllmLaunchers:
    parts = [rk.LAUNCH_PRELUDE]
    for fname, qualname in rk.LAUNCH_SOURCES:
        parts += _source_of(root, fname, qualname, rk.FILES)
    module = _module_from(parts, "vllm_replay_launchers")
    made = {}
    for key, (name, is_class) in rk.SOURCE_LAUNCHERS.items():
        obj = getattr(module, name)
        made[key] = obj() if is_class else obj
    return VllmLaunchers(**made, origin=f"source files under {root}")


def _launchers_installed(rk) -> VllmLaunchers:
    return VllmLaunchers(**{key: _installed(target) for key, target in rk.INSTALLED_LAUNCHERS.items()},
                         origin=_vllm_origin())


def load_launchers(source: str | os.PathLike | None = None) -> tuple[VllmLaunchers | None, str]:
    """``(launchers, where from)`` or ``(None, why not)``: :func:`load`'s sources (the
    folder needs the release's launch files too: ``jit_warmup.py`` and
    ``jit_warmup_triton_helper.py`` for 0.33)."""
    return _load(source, _launchers_from_source, _launchers_installed, lambda rk: [f for f, _ in rk.LAUNCH_SOURCES])


def token_to_req_indices(query_start_loc: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """What vLLM's ``compute_token_to_req_indices`` gives for tokens inside the batch
    (``searchsorted`` over the device ``query_start_loc``); tokens past it map to the last
    request (invalid there anyway)."""
    from ..common.ops._batch import token_view

    return token_view(query_start_loc, None, num_tokens).req.to(torch.int32)
