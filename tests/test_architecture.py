"""The layers of docs/architecture.md: no module imports from a layer above its own.

Every import counts, including those inside functions (lazy imports are still dependencies).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "parplan"

#: Layer of each top-level part of the package, lowest first (docs/architecture.md).
LAYERS = {
    "errors": 0, "readers": 0,
    "collectives": 1,
    "costmodel": 2,
    "formulation": 3,
    "solvers": 4,
    "models": 5, "pipeline": 5, "executor": 5, "calibration": 5,
    "reporting": 6, "bench": 6,
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
    bad = [(line, module) for line, module in _imports(path)
           if _part(module) in LAYERS and LAYERS[_part(module)] > LAYERS[mine]]
    assert not bad, f"{path.relative_to(ROOT.parent)} (layer {mine}) imports from above: {bad}"
