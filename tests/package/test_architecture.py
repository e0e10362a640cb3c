"""The layering of the package, read from its source: every import goes down the layers
(contract -> kernels -> platform backends -> dispatch -> PCP composite -> integration), no
import circle (lazy imports included), and the test tooling (``swa_backends.testing``) stays out of the product."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_DIRS = ("common", "kernels", "backends", "testing", "integrations")
TOP_MODULES = ("__init__", "__main__", "dispatch", "pcp", "torch_ops", "plugin", "cli")

# bottom-up; a module may import its own layer or lower ones. The package root is the public
# API (it re-exports the contract, dispatch and the PCP composite); integrations build on it.
LAYERS = {"common": 0, "kernels": 1, "backends": 2, "dispatch": 3, "pcp": 4, "__init__": 5, "torch_ops": 5,
          "integrations": 6, "plugin": 7, "cli": 7, "__main__": 8, "testing": 9}
# imports that go up on purpose, each inside a function: the CLI's check / matrix / --emulate
# commands load the test tooling only when asked
ALLOWED_UP = {("cli", "testing")}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["swa_backends", *parts])


def _layer(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _sources() -> dict[str, Path]:
    files = [ROOT / f"{m}.py" for m in TOP_MODULES]
    for d in PRODUCT_DIRS:
        files += sorted((ROOT / d).rglob("*.py"))
    return {_module_name(f): f for f in files if f.exists()}


def _imports(module: str, path: Path) -> list[tuple[str, bool]]:
    """``(imported swa_backends module, at module level)`` for every import in ``path``."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    top_level = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target] + [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] == "swa_backends":
                found.append((name, id(node) in top_level))
    return found


def _graph() -> dict[str, set[str]]:
    sources = _sources()
    graph: dict[str, set[str]] = {}
    for module, path in sources.items():
        deps = set()
        for name, _ in _imports(module, path):
            while name not in sources and "." in name:
                name = name.rsplit(".", 1)[0]  # 'pkg.module.attr' -> the module that defines it
            if name in sources and name != module:
                deps.add(name)
        graph[module] = deps
    return graph


def test_every_import_goes_down_the_layers():
    sources = _sources()
    bad = []
    for module, path in sources.items():
        me = _layer(module)
        for name, _ in _imports(module, path):
            other = _layer(name)
            if other in LAYERS and LAYERS[other] > LAYERS[me] and (me, other) not in ALLOWED_UP:
                bad.append(f"{module} imports {name} ({me} -> {other})")
    assert not bad, "\n".join(bad)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of ``graph`` with more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    """No circle of imports, at import time or in the logic: imports inside functions and under
    TYPE_CHECKING count too (a lazy import that closes a circle only hides it). A package's
    ``__init__`` importing its own submodules (re-exports) is no circle."""
    sources = _sources()
    packages = {m for m, path in sources.items() if path.name == "__init__.py"}
    graph = {m: {d for d in deps if not (m in packages and d.startswith(m + "."))} for m, deps in _graph().items()}
    circles = _circles(graph)
    assert not circles, "\n".join(", ".join(c) for c in circles)


def test_the_circle_finder_finds_a_lazy_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_the_product_loads_no_test_tooling_and_no_vendor_package():
    """Import, select and run on the CPU: no Triton, no vendor package, no test tooling. Then
    assess a CUDA device: its probes may import Triton (a CUDA requirement), still no other
    platform's vendor package and no test tooling."""
    code = (
        "import sys, torch, swa_backends as sb\n"
        "vendors = ('vllm', 'vllm_ascend', 'flashinfer', 'aiter', 'torch_npu', 'flash_mla')\n"
        "def loaded(names): return sorted(m for m in sys.modules if m.startswith('swa_backends.testing') "
        "or m.split('.')[0] in names)\n"
        "be = sb.select('cpu')\n"
        "x = torch.arange(12.).reshape(4, 3); be.gather_rows(x, torch.tensor([2, 0]))\n"
        "import swa_backends.torch_ops, swa_backends.plugin\n"
        "print(loaded(('triton',) + vendors))\n"
        "sb.explain('cuda:sm90'); sb.capabilities('rocm:gfx942')\n"
        "print(loaded(('torch_npu', 'vllm_ascend', 'flash_mla')))\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-2:] == ["[]", "[]"], out.stdout


ENGINES_AND_VENDORS = ("vllm", "vllm_ascend", "flashinfer", "aiter", "torch_npu", "flash_mla")


def _module_level_imports(path: Path) -> list[str]:
    """Top-level package names imported when ``path`` is imported: module body, class bodies
    and top-level ``if``/``try`` blocks; not function bodies (those run when called)."""
    found: list[str] = []

    def visit(nodes):
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.Import):
                found.extend(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.append(node.module.split(".")[0])
            for field in ("body", "orelse", "finalbody", "handlers"):
                visit(getattr(node, field, []) or [])

    visit(ast.parse(path.read_text()).body)
    return found


def test_no_module_imports_an_engine_or_vendor_package_when_imported():
    """Every module of the package, the vLLM integration and the test tooling included, can be
    imported without vLLM, vllm-ascend or a vendor kernel package: those are imported inside
    the functions that need them (their absence becomes a reason, never an ImportError)."""
    bad = {m: sorted(set(n for n in _module_level_imports(p) if n in ENGINES_AND_VENDORS))
           for m, p in _sources().items()}
    assert not {m: v for m, v in bad.items() if v}, bad


@pytest.mark.parametrize("module", ["swa_backends.kernels.sparse_mla", "swa_backends.kernels.rows"])
def test_kernel_files_read_no_environment_switch(module):
    """What runs is decided by dispatch (and shown by explain()), never by an environment
    variable read in a kernel file (TRITON_INTERPRET is Triton's own, read where Triton reads it)."""
    src = (ROOT / (module.split(".", 1)[1].replace(".", "/") + ".py")).read_text()
    reads = [ln.strip() for ln in src.splitlines() if "os.environ" in ln and "TRITON_INTERPRET" not in ln]
    assert not reads, reads
