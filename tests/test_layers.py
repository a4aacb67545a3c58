"""The layers only point down: each top-level package imports only the ones below it.

Read from the code's own imports (every ``import`` and ``from … import`` at any depth of
every module), not from a list kept beside the code.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Each package, and the packages it may import (besides itself). Bottom first.
ALLOWED: dict[str, set[str]] = {
    "shardfarm": set(),
    "sharding": {"shardfarm"},
    "farmcore": {"shardfarm", "sharding"},
    "loaders": {"shardfarm", "sharding", "farmcore"},
    "exporters": {"shardfarm", "sharding", "farmcore"},
    "jobs": {"shardfarm", "sharding", "farmcore"},
    "workers": {"shardfarm", "sharding", "farmcore", "jobs", "loaders", "exporters"},
    "demo": {"shardfarm", "sharding", "farmcore", "jobs", "loaders", "exporters", "workers"},
    "dashboard": {"shardfarm", "sharding", "farmcore", "jobs", "loaders", "exporters",
                  "workers"},
    "scripts": {"shardfarm", "sharding", "farmcore", "jobs", "loaders", "exporters",
                "workers", "demo", "dashboard"},
}


def imports_of(package: str) -> set[tuple[str, str]]:
    """``(module file, imported top-level package)`` for every import in ``package``."""
    out = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            out.update((str(path.relative_to(ROOT)), n.split(".")[0]) for n in names)
    return out


def test_every_package_imports_only_the_layers_below_it():
    wrong = sorted(f"{where} imports {top}"
                   for package, allowed in ALLOWED.items()
                   for where, top in imports_of(package)
                   if top in ALLOWED and top != package and top not in allowed)
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_the_layer_table_has_no_cycle_and_knows_every_package():
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    packages -= {"tests", "benchmarks"}  # they may use every layer
    assert packages == set(ALLOWED), packages ^ set(ALLOWED)
    order = list(ALLOWED)
    for i, package in enumerate(order):
        assert ALLOWED[package] <= set(order[:i]), f"{package} may import a layer above it"


def test_the_check_sees_a_wrong_import(tmp_path, monkeypatch):
    (tmp_path / "sharding").mkdir()
    (tmp_path / "sharding" / "bad.py").write_text("def f():\n    from jobs import queue\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert ("sharding/bad.py", "jobs") in imports_of("sharding")
