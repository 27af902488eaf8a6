"""The layers of docs/architecture.md: no module imports from a layer above its own.

Every import counts, including those inside functions (lazy imports are still dependencies).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "parplan"

#: Layer of each top-level part of the package, lowest first (docs/architecture.md).
LAYERS = {
    "errors": 0,
    "readers": 0,
    "collectives": 1,
    "costmodel": 2,
    "formulation": 3,
    "solvers": 4,
    "models": 5,
    "pipeline": 5,
    "executor": 5,
    "calibration": 5,
    "reporting": 6,
    "bench": 6,
    "cli": 7,
}


def _part(module: str) -> str:
    return module.split(".")[1] if module.count(".") >= 1 else ""


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "parplan":
                out += [(node.lineno, f"parplan.{a.name}") for a in node.names]
            elif node.module.startswith("parplan."):
                out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("parplan.")]
    return out


FILES = sorted(p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] != "__init__.py")


def test_every_part_has_a_layer():
    parts = {p.relative_to(ROOT).parts[0].removesuffix(".py") for p in FILES}
    assert parts <= set(LAYERS), parts - set(LAYERS)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_upward_imports(path):
    mine = path.relative_to(ROOT).parts[0].removesuffix(".py")
    bad = [
        (line, module)
        for line, module in _imports(path)
        if _part(module) in LAYERS and LAYERS[_part(module)] > LAYERS[mine]
    ]
    assert not bad, f"{path.relative_to(ROOT.parent)} (layer {mine}) imports from above: {bad}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (every import, inside functions too); ``from
    parplan.a import b`` names the module ``parplan.a.b`` when there is one."""
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("parplan")
                and not node.level
            ):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add(full if full in paths else node.module)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("parplan")}
        graph[name] = {d for d in deps if d in paths and d != name}
    return graph


def test_no_import_circles():
    """No module reaches itself through imports, lazy ones included (docs/architecture.md): a
    circle hidden by an import inside a function is still a circle."""
    graph = _module_graph()
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                circles.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"
