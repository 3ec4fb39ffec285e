"""Engines: what decodes a turn (`base.Engine`), one module each, declared by its `SPEC = EngineSpec(...)`
(evalsuite.catalog finds them; no list to edit). `hf.HfEngine` is ours; `vllm_engine.VllmEngine` runs vLLM in its
own venv."""

from __future__ import annotations

from pathlib import Path

from evalsuite.catalog import engine_spec


def make_engine(config, run_dir: Path):
    """The engine `config.engine` names, built by its module's `build(config, run_dir)` (imported only when chosen:
    vLLM's module needs no torch, ours does)."""
    return engine_spec(config.engine).factory(config, run_dir)
