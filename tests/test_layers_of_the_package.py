"""Imports point one way (DESIGN.md): each package of ``hopfield`` imports only those before it
in the order below, at module level or inside a function, so there are no circles."""

from __future__ import annotations

import ast
from pathlib import Path

import hopfield

#: The layers, lowest first; modules of one layer may import each other.
ORDER = (
    ("stats", "tables", "_validation", "_install", "_scalars"),
    ("functional",),
    ("memory", "nn"),
    ("models", "integrations", "outliers", "data"),
    ("training",),
    ("experiments",),
    ("plan",),
    ("claims",),
    ("report",),
    ("cli", "__main__", "__init__"),
)
LAYER = {name: rank for rank, names in enumerate(ORDER) for name in names}
ROOT = Path(hopfield.__file__).parent


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "hopfield" and len(parts) > 1 else None


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {p for p in map(_package, found) if p is not None}


def test_every_package_has_a_layer() -> None:
    packages = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
                if (p.suffix == ".py" or (p / "__init__.py").exists())}  # fmt: skip
    assert packages <= set(LAYER), packages - set(LAYER)


def test_imports_point_down() -> None:
    upward = []
    for path in ROOT.rglob("*.py"):
        relative = path.relative_to(ROOT)
        me = relative.parts[0].removesuffix(".py")
        for other in _imports(path):
            if other != me and LAYER[other] > LAYER[me]:
                upward.append(f"{relative} imports hopfield.{other}")
    assert not upward, "\n".join(sorted(upward))
