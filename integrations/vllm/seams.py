"""The vLLM code the integration relies on, checked against the release it was written for.

A :class:`Seam` names one definition in vLLM (``"module:Qual.name"``): a function or method
the integration overrides, calls, reproduces or mirrors, a class it subclasses or swaps an
object's ``__class__`` to a subclass of, a module global it patches. Each carries the
parameter names and the source fingerprint of the pinned release (the table: each release
subpackage's ``seams`` module, ``v0_33/seams.py``). :func:`check` compares the installed vLLM
with the table; ``install()`` runs it once per process before it registers anything, and on
any mismatch leaves vLLM untouched with one log line naming the seams (so a ``0.33.x`` that
changed one falls back instead of serving through a stale copy).

Fingerprint (:func:`fingerprint`): the first 16 hex digits of the sha256 of the definition's
syntax tree, written out field by field with positions, docstrings and empty fields left out
and each line of a string constant stripped. Comments, formatting and docstrings do not count;
any change to code does, and the text is the same on every Python vLLM 0.33 runs on (3.10 to
3.13: ``ast.dump`` is not). Per kind:

* ``def``: the whole ``def`` (decorators, signature, body);
* ``class``: the class statement's bases, keywords and decorators and the sorted names its
  body defines (a member added, removed or renamed; the members' bodies are seams of their
  own where the integration relies on them);
* ``global``: the module-level statement that binds the name (an assignment, or one name of
  an import).

Where the seam's module is already imported, a ``def`` or ``class`` seam is read from the live
object (what will run: a function replaced at runtime is seen, and drift tests simulate a
changed release by replacing one); otherwise from the module's file, parsed without importing
it, so the check imports nothing from vLLM (``importlib.util.find_spec`` of a submodule would
import its parents). Both give the same fingerprint for the same code (tested). A module whose
file is byte for byte the pinned one (``FILES``) holds its seams without a parse, unless a live
object under a seam's name is not the one that file defines: through unchanged files the check
costs milliseconds, where parsing every file or reading every live object costs about a second
(``tests/integration/vllm/test_vllm_seams.py`` prints each and bounds the unchanged-files check;
bench/README.md, "Host costs on the CPU").

``python -m swa_backends.integrations.vllm.v0_33.seams`` (a release's table run as a script:
:func:`report`) prints the installed vLLM's signature and fingerprint of every seam of that
table, marking each that differs (for a maintainer moving a copy of the table to a new
release: read vLLM's diff of each marked seam first).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass

KINDS = ("def", "class", "global")
#: ``serve``: checked by ``install()`` (the serving path relies on it); ``cli``: mirrored by the
#: decision command only (``python -m swa_backends.integrations.vllm``), which reports a mismatch
SCOPES = ("serve", "cli")


@dataclass(frozen=True)
class Seam:
    """One vLLM definition the integration relies on.

    ``target``: ``"module:Qual.name"``; ``why``: what the integration does with it;
    ``params``: the pinned parameter names (``def`` seams; None: not checked);
    ``fingerprint``: the pinned :func:`fingerprint` (None: the signature alone is relied on);
    ``platform``: ``"cuda"`` or ``"rocm"`` where the seam is used on one platform only;
    ``scope``: one of :data:`SCOPES`."""

    target: str
    why: str
    params: tuple[str, ...] | None = None
    fingerprint: str | None = None
    kind: str = "def"
    platform: str | None = None
    scope: str = "serve"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Seam: kind={self.kind!r}: expected one of {KINDS}")
        if self.scope not in SCOPES:
            raise ValueError(f"Seam: scope={self.scope!r}: expected one of {SCOPES}")
        if ":" not in self.target:
            raise ValueError(f"Seam: target={self.target!r}: expected 'module:Qual.name'")

    @property
    def module(self) -> str:
        return self.target.split(":", 1)[0]

    @property
    def qualname(self) -> str:
        return self.target.split(":", 1)[1]

    @property
    def name(self) -> str:
        """``Qual.name`` (what a log line names)."""
        return self.qualname


# ---------------------------------------------------------------------------------------
# the fingerprint
# ---------------------------------------------------------------------------------------


_SCOPES_WITH_DOCSTRINGS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _canon(node) -> str:
    """``node`` written out field by field: positions, empty fields and docstrings left out,
    each line of a string stripped (``ast.dump`` differs between Pythons: 3.12 adds
    ``type_params``, 3.13 drops empty fields)."""
    if isinstance(node, ast.AST):
        fields = []
        for name in node._fields:
            value = getattr(node, name, None)
            if name == "body" and isinstance(node, _SCOPES_WITH_DOCSTRINGS):
                value = _without_docstring(value)
            if value is None or (isinstance(value, list) and not value):
                continue
            fields.append(f"{name}={_canon(value)}")
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return "[" + ",".join(_canon(v) for v in node) + "]"
    if isinstance(node, str):
        return repr("\n".join(line.strip() for line in node.splitlines()))
    return repr(node)


def _without_docstring(body: list) -> list:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def _member_names(body: list) -> list[str]:
    names = []
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names += [t.id for t in stmt.targets if isinstance(t, ast.Name)]
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            names.append(stmt.target.id)
    return sorted(set(names))


def fingerprint(node: ast.AST, kind: str = "def") -> str:
    """The fingerprint of a definition's syntax tree (the module docstring says what counts)."""
    if kind == "class":
        text = "|".join([_canon(node.bases), _canon(node.keywords), _canon(node.decorator_list),
                         ",".join(_member_names(node.body))])
    else:
        text = _canon(node)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def file_hash(path: str) -> str:
    """sha256 (first 16 hex digits) of a file's bytes: a module whose file is the pinned one
    holds every seam of it unchanged (the check's fast path)."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def params(node: ast.AST) -> tuple[str, ...]:
    """A ``def``'s parameter names in order (``*args`` / ``**kwargs`` by their names), as
    ``inspect.signature`` lists them."""
    a = node.args
    names = [p.arg for p in (*a.posonlyargs, *a.args)]
    if a.vararg is not None:
        names.append(a.vararg.arg)
    names += [p.arg for p in a.kwonlyargs]
    if a.kwarg is not None:
        names.append(a.kwarg.arg)
    return tuple(names)


# ---------------------------------------------------------------------------------------
# finding a seam's definition
# ---------------------------------------------------------------------------------------


class SeamNotFound(LookupError):
    pass


def module_file(module: str) -> str:
    """The source file of ``module`` without importing it (nor its parent packages): its
    ``__file__`` when it is imported, else found under its top-level package's directory."""
    mod = sys.modules.get(module)
    if mod is not None and getattr(mod, "__file__", None):
        return mod.__file__
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise SeamNotFound(f"package {top} is not installed")
    for root in spec.submodule_search_locations:
        base = os.path.join(root, *rest)
        for path in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(path):
                return path
    raise SeamNotFound(f"no source file for module {module}")


def _scopes(body: list) -> Iterable:
    """The statements of a body, those of module-level ``if`` / ``try`` blocks included
    (platform-conditional definitions)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If):
            yield from _scopes(stmt.body)
            yield from _scopes(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for part in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                yield from _scopes(part)


def _find_def(tree: ast.Module, qualname: str) -> ast.AST:
    body, node = tree.body, None
    for part in qualname.split("."):
        found = [s for s in _scopes(body) if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 and s.name == part]
        if not found:
            raise SeamNotFound(f"{qualname}: no definition of {part}")
        node = found[-1]  # the one that binds last
        body = node.body
    return node


def _find_global(tree: ast.Module, name: str) -> ast.AST:
    """The module-level statement binding ``name`` last: an assignment, or the one name of an
    import (as an ``ImportFrom`` of that name alone)."""
    found = None
    for stmt in _scopes(tree.body):
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
            found = stmt
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
            found = stmt
        elif isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if (alias.asname or alias.name) == name:
                    found = ast.ImportFrom(module=stmt.module, names=[alias], level=stmt.level)
    if found is None:
        raise SeamNotFound(f"no module-level binding of {name}")
    return found


def _unwrap(obj):
    """The Python function behind a method, property, static/class method, Triton
    ``JITFunction`` (``.fn``) or ``functools.wraps`` wrapper."""
    for _ in range(8):
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        elif isinstance(obj, property):
            obj = obj.fget
        elif not inspect.isfunction(obj) and not inspect.isclass(obj) and inspect.isfunction(getattr(obj, "fn", None)):
            obj = obj.fn
        else:
            break
    return inspect.unwrap(obj) if inspect.isfunction(obj) else obj


def _live_object(seam: Seam, module):
    obj = module
    for part in seam.qualname.split("."):
        namespace = vars(obj)  # the class's own members, as the file defines them (not inherited ones)
        if part not in namespace:
            raise SeamNotFound(f"{seam.qualname}: {getattr(obj, '__name__', obj)} defines no {part}")
        obj = _unwrap(namespace[part])
    return obj


def _is_defined_there(seam: Seam, module) -> bool:
    """The live object is the one the module's file defines under the seam's name (its module
    and qualified name say so): then an unchanged file is all there is to check."""
    try:
        obj = _live_object(seam, module)
    except Exception:  # noqa: BLE001 - the full check reports it
        return False
    return getattr(obj, "__module__", None) == seam.module and getattr(obj, "__qualname__", None) == seam.qualname


def _live_node(seam: Seam, module) -> ast.AST:
    obj = _live_object(seam, module)
    want = ast.ClassDef if seam.kind == "class" else (ast.FunctionDef, ast.AsyncFunctionDef)
    if not (inspect.isclass(obj) if seam.kind == "class" else inspect.isfunction(obj)):
        raise SeamNotFound(f"{seam.qualname}: a {type(obj).__name__}, not a {seam.kind}")
    src = inspect.getsource(obj)
    if src[:1].isspace():  # a member: parse it inside a block (dedenting would change its strings)
        stmt = ast.parse("if 1:\n" + src).body[0].body[0]
    else:
        stmt = ast.parse(src).body[0]
    if not isinstance(stmt, want):
        raise SeamNotFound(f"{seam.qualname}: its source is a {type(stmt).__name__}, not a {seam.kind}")
    return stmt


def definition(seam: Seam, *, live: bool = True, _trees: dict | None = None) -> ast.AST:
    """The syntax tree of ``seam``'s definition in the installed vLLM (:class:`SeamNotFound`
    if it is gone); ``live``: from the live object where its module is imported."""
    module = sys.modules.get(seam.module) if live else None
    if module is not None and seam.kind != "global":
        return _live_node(seam, module)
    trees = _trees if _trees is not None else {}
    tree = trees.get(seam.module)
    if tree is None:
        path = module_file(seam.module)
        with open(path, encoding="utf-8") as f:
            tree = trees[seam.module] = ast.parse(f.read(), filename=path)
    if seam.kind == "global":
        return _find_global(tree, seam.qualname)
    return _find_def(tree, seam.qualname)


# ---------------------------------------------------------------------------------------
# the check
# ---------------------------------------------------------------------------------------


def selected(seams: Iterable[Seam], *, platform: str | None = None, scope: str = "serve") -> list[Seam]:
    """The seams of ``scope`` that apply on ``platform`` (``"cuda"``, ``"rocm"``; None: all)."""
    return [s for s in seams if s.scope == scope and (platform is None or s.platform in (None, platform))]


def mismatch(seam: Seam, *, live: bool = True, _trees: dict | None = None) -> str | None:
    """Why the installed vLLM differs from ``seam``'s pin (naming the seam), None when it
    matches."""
    try:
        node = definition(seam, live=live, _trees=_trees)
    except Exception as exc:  # noqa: BLE001 - gone, unreadable or not a definition: all a mismatch
        return f"{seam.target}: not found ({type(exc).__name__}: {exc})"
    if seam.params is not None and seam.kind == "def":
        got = params(node)
        if got != seam.params:
            return f"{seam.target}: parameters ({', '.join(got)}) != pinned ({', '.join(seam.params)})"
    if seam.fingerprint is not None:
        got = fingerprint(node, seam.kind)
        if got != seam.fingerprint:
            return f"{seam.target}: source changed (fingerprint {got}, pinned {seam.fingerprint})"
    return None


def check(seams: Iterable[Seam], *, files: dict[str, str] | None = None, platform: str | None = None,
          scope: str = "serve", live: bool = True) -> list[str]:
    """Every mismatch (:func:`mismatch`) among the seams of ``scope`` on ``platform``; empty
    when the installed vLLM is the pinned one there. ``files``: module -> pinned
    :func:`file_hash`: the seams of a module whose file is the pinned one hold without a
    parse, unless the live object under a seam's name is not the one that file defines (a
    function replaced at runtime). Each file is parsed at most once."""
    chosen = selected(seams, platform=platform, scope=scope)
    unchanged = set()
    for module in dict.fromkeys(s.module for s in chosen) if files else ():
        try:
            if module in files and file_hash(module_file(module)) == files[module]:
                unchanged.add(module)
        except Exception:  # noqa: BLE001 - no fast path: the seams are read one by one
            pass
    trees: dict = {}
    problems = []
    for s in chosen:
        if s.module in unchanged:
            module = sys.modules.get(s.module) if live and s.kind != "global" else None
            if module is None or _is_defined_there(s, module):
                continue  # the pinned file's own definition: it holds
        why = mismatch(s, live=live, _trees=trees)
        if why is not None:
            problems.append(why)
    return problems


def file_hashes(seams: Iterable[Seam]) -> dict[str, str | None]:
    """module -> :func:`file_hash` of its installed file (None where there is none), for the
    modules holding ``seams``: the table's ``FILES`` for the installed release."""
    out: dict[str, str | None] = {}
    for module in dict.fromkeys(s.module for s in seams):
        try:
            out[module] = file_hash(module_file(module))
        except Exception:  # noqa: BLE001 - reported as None
            out[module] = None
    return out


def current(seams: Iterable[Seam], *, live: bool = False) -> list[tuple[Seam, tuple[str, ...] | None, str | None]]:
    """``(seam, parameters, fingerprint)`` of the installed vLLM for each seam (None where it
    is not found or not a ``def``): the table's values for the installed release."""
    trees: dict = {}
    out = []
    for s in seams:
        try:
            node = definition(s, live=live, _trees=trees)
        except Exception:  # noqa: BLE001 - reported as not found
            out.append((s, None, None))
            continue
        out.append((s, params(node) if s.kind == "def" else None, fingerprint(node, s.kind)))
    return out


def report(seams: Iterable[Seam], files: dict[str, str], release: str) -> int:
    """Print the installed vLLM's parameters and fingerprint of every seam of a table pinned
    from ``release`` (``files``: its file hashes), ``*`` marking each that differs; returns 0."""
    try:
        from importlib.metadata import version

        installed = version("vllm")
    except Exception:  # noqa: BLE001 - a report line only
        installed = "unknown"
    print(f"# vLLM {installed} against the table pinned from {release} (* marks a difference)")
    for s, got_params, got_fp in current(seams):
        differs = (got_fp is None or (s.fingerprint is not None and got_fp != s.fingerprint)
                   or (s.params is not None and got_params != s.params))
        sig = "" if got_params is None else f" params={got_params!r}"
        print(f"{'*' if differs else ' '} {s.target} [{s.kind}]{sig} fingerprint={got_fp}")
    for module, got in file_hashes(seams).items():
        print(f"{'*' if got != files.get(module) else ' '} file {module} sha256={got}")
    return 0
