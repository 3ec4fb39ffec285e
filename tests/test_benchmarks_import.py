"""Every benchmark script still imports against the package (a module moved without its callers is caught here,
not by the next person who runs the benchmark)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize("name", sorted(p.stem for p in BENCHMARKS.glob("*.py")))
def test_the_benchmark_imports(name, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    module = importlib.import_module(name)
    assert hasattr(module, "main") or module.__doc__, f"benchmarks/{name}.py has neither main() nor a docstring"
    sys.modules.pop(name, None)
