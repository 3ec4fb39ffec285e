"""Engines: what decodes a turn (`base.Engine`). `hf.HfEngine` is ours; `vllm_engine.VllmEngine` runs vLLM in its own venv."""

from __future__ import annotations

from pathlib import Path


def make_engine(config, run_dir: Path):
    """The engine `config.engine` names (imported only when chosen: vLLM's module needs no torch, ours does)."""
    if config.engine == "vllm":
        from evalsuite.engines.vllm_engine import VllmEngine

        return VllmEngine(config, run_dir)
    from evalsuite.engines.hf import HfEngine

    return HfEngine(config)
