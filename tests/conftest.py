"""Shared fixtures: tiny random targets built once per session (Llama and Qwen3), as HF directories."""

from __future__ import annotations

import pytest
import torch

from evalsuite.target.model import TargetModel
from evalsuite.testing import build_tiny_target

torch.set_num_threads(1)  # tiny models: threads only add overhead and contention on a 2-core machine


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-targets")
    return {arch: build_tiny_target(root / arch, arch) for arch in ("llama", "qwen3")}


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_dirs):
    return tiny_dirs["llama"]


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tiny_dirs):
    return tiny_dirs["qwen3"]


@pytest.fixture(scope="session", params=["llama", "qwen3"])
def tiny_target(request, tiny_dirs) -> TargetModel:
    return TargetModel.load(str(tiny_dirs[request.param]))


@pytest.fixture(autouse=True)
def _quick_cpu_sample(monkeypatch):
    """Runs sample the machine's load before they start (evalsuite.contention): briefly, in tests."""
    monkeypatch.setenv("EVALSUITE_CPU_SAMPLE_S", "0.05")
