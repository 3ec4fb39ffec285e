"""--engine vllm without vLLM: step rebuilding, method checks, checkpoint conversion, compare, error lines.

The end-to-end run through vLLM itself is tests/test_vllm_integration.py (it needs .venv-vllm)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.compare import compare_turns, engines_side_by_side, first_divergence
from evalsuite.config import RunConfig
from evalsuite.engines import vllm_engine
from evalsuite.engines.vllm_steps import rebuild_steps
from evalsuite.errors import UserError
from evalsuite.store.records import TURN_SCHEMA, STEP_SCHEMA, StepRecord, TurnRecord
from evalsuite.store.run_store import RunTables

cli = CliRunner()


def test_rebuild_steps_places_undrafted_steps_by_the_oracle():
    # 1 prefill token, then: no draft, a 3-draft step accepting 2, no draft, a 2-draft step accepting 0
    drafts_at = {2, 6}
    steps, exact = rebuild_steps(10, 1 + 1 + 3 + 1 + 1, [2, 0], [3, 2], lambda pos: pos in drafts_at)
    assert exact
    assert [(s["context_len"], s["num_drafted"], s["num_accepted"], s["emitted"]) for s in steps] == [
        (10, 0, 0, 1), (11, 3, 2, 3), (14, 0, 0, 1), (15, 2, 0, 1)]
    assert 1 + sum(s["emitted"] for s in steps) == 7


def test_rebuild_steps_without_oracle_and_cut_at_the_budget():
    steps, exact = rebuild_steps(5, 6, [4], [4])
    assert exact and [s["emitted"] for s in steps] == [5]
    steps, exact = rebuild_steps(5, 7, [4, 4], [4, 4])  # the second step's 5 tokens are cut to the 1 left
    assert exact and [s["emitted"] for s in steps] == [5, 1]
    ar, exact = rebuild_steps(3, 4, [], [])
    assert exact and [s["num_drafted"] for s in ar] == [0, 0, 0] and [s["context_len"] for s in ar] == [3, 4, 5]


def test_rebuild_steps_flags_steps_that_do_not_tile():
    steps, exact = rebuild_steps(5, 3, [0, 0, 0], [2, 2, 2])
    assert not exact and len(steps) == 3 and [s["num_drafted"] for s in steps] == [2, 2, 2]


def test_records_carry_the_engine_column():
    assert "engine" in TURN_SCHEMA.names and "engine" in STEP_SCHEMA.names
    assert TurnRecord.__dataclass_fields__["engine"].default == "hf"
    assert StepRecord.__dataclass_fields__["engine"].default == "hf"


@pytest.mark.parametrize("method", ["dlite", "dflash", "dspark"])
def test_methods_vllm_lacks_are_one_line_errors(method):
    config = RunConfig(methods=["ar", method], task="gsm8k", engine="vllm")
    with pytest.raises(UserError, match=r"vLLM runs ar, ngram, suffix, eagle3"):
        config.validate()
    RunConfig(methods=["ar", "ngram", "eagle3"], task="gsm8k", engine="vllm").validate()


def test_vllm_on_cuda_in_bfloat16_is_a_valid_configuration_and_loads_no_weights(tiny_llama_dir, tmp_path, monkeypatch):
    """Built and described without a GPU or vLLM: the worker gets the run's dtype and device, and the engine reads
    only the tokenizer and config (AutoModelForCausalLM is never called)."""
    config = RunConfig(methods=["ngram"], task="gsm8k", engine="vllm", device="cuda", dtype="bfloat16",
                       target=str(tiny_llama_dir))
    config.validate()
    import transformers

    def no_weights(*args, **kwargs):
        raise AssertionError("the vLLM engine must not load the target's weights")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    engine = vllm_engine.VllmEngine(config, tmp_path)
    engine.chat = vllm_engine.load_chat(config.target)
    worker = engine.worker_config("ngram")
    assert worker["dtype"] == "bfloat16" and worker["device"] == "cuda"
    assert worker["max_model_len"] == engine.chat.max_context and worker["stop_ids"] == sorted(engine.chat.stop_ids)


def test_missing_vllm_is_a_one_line_error(monkeypatch, tmp_path, tiny_llama_dir):
    monkeypatch.delenv(vllm_engine.PYTHON_ENV, raising=False)
    monkeypatch.setattr(vllm_engine, "REPO_ROOT", tmp_path)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    result = cli.invoke(app, ["run", "--engine", "vllm", "--method", "ngram", "--task", "gsm8k", "--limit", "1",
                              "--target", str(tiny_llama_dir), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "vLLM is not installed" in result.output and "scripts/setup_vllm.sh" in result.output
    monkeypatch.setenv(vllm_engine.PYTHON_ENV, str(tmp_path / "nope" / "python"))
    with pytest.raises(UserError, match="does not exist"):
        vllm_engine.find_vllm_python()


def test_dlite_on_vllm_from_the_cli(tmp_path, tiny_llama_dir):
    result = cli.invoke(app, ["run", "--engine", "vllm", "--method", "dlite", "--task", "gsm8k",
                              "--target", str(tiny_llama_dir), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "no DLite drafter" in result.output and "ngram" in result.output


def test_eagle3_checkpoint_is_shifted_into_vllm_layer_convention(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_bytes(b"x")
    config = {"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]}}
    (src / "config.json").write_text(json.dumps(config))
    info = vllm_engine.eagle3_for_vllm(src, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert info["vllm_aux_hidden_state_layer_ids"] == [2, 15, 27] and len(info["converted_config_sha256"]) == 64
    assert (tmp_path / "out" / "model.safetensors").resolve() == (src / "model.safetensors").resolve()


def _run(rows, steps):
    base = dict(task="t", replay="free", stop_reason="eos", new_tokens=10, ar_new_tokens=10, tau=float("nan"),
                speedup=float("nan"))
    turns = pd.DataFrame([{**base, **r} for r in rows]).rename(columns={"speedup": "speedup_turn"})
    steps = pd.DataFrame([dict(zip(["method", "sample_id", "turn", "num_accepted"], s), budget_limited=False)
                          for s in steps])
    return RunTables(Path("."), {}, steps, turns)


def test_compare_reports_divergence_pooled_tau_speedup_and_losslessness():
    a = _run([dict(method="ar", sample_id="s", turn=0, output_ids=[1, 2, 3], decode_s=1.0, ar_decode_s=1.0),
              dict(method="ngram", sample_id="s", turn=0, output_ids=[1, 2, 3], decode_s=1.0, ar_decode_s=2.0),
              dict(method="ngram", sample_id="s", turn=1, output_ids=[4, 5], decode_s=3.0, ar_decode_s=2.0)],
             [("ngram", "s", 0, 1), ("ngram", "s", 0, 0), ("ngram", "s", 1, 3)])
    b = _run([dict(method="ar", sample_id="s", turn=0, output_ids=[1, 2, 9], decode_s=1.0, ar_decode_s=1.0),
              dict(method="ngram", sample_id="s", turn=0, output_ids=[1, 2, 9], decode_s=1.0, ar_decode_s=1.0),
              dict(method="ngram", sample_id="s", turn=1, output_ids=[4, 6], decode_s=1.0, ar_decode_s=3.0)],
             [("ngram", "s", 0, 2), ("ngram", "s", 1, 0), ("ngram", "s", 1, 0), ("ngram", "s", 1, 0)])
    both = compare_turns(a.turns, b.turns, "hf", "vllm")
    row = both[(both.method == "ngram") & (both.turn == 0)].iloc[0]
    assert not row.equal_ids and row.first_divergence == 2
    assert row.equal_to_ar_hf and row.equal_to_ar_vllm
    later = both[(both.method == "ngram") & (both.turn == 1)].iloc[0]
    assert later.history_differs  # free replay after a diverged turn: different histories
    side = engines_side_by_side(a, b, "hf", "vllm").set_index("method")
    assert side.loc["ngram", "equal ids"] == "0/2"
    # pooled over steps, not a mean of per-turn τ: hf (2 + 1 + 4) / 3 steps; vllm (3 + 1 + 1 + 1) / 4 steps
    assert side.loc["ngram", "tau hf"] == pytest.approx(7 / 3) and side.loc["ngram", "tau vllm"] == pytest.approx(1.5)
    # pooled over turns: (Σ ar s / Σ ar tokens) / (Σ s / Σ tokens) = 4 / 4 and 4 / 2
    assert side.loc["ngram", "speedup hf"] == pytest.approx(1.0) and side.loc["ngram", "speedup vllm"] == 2.0
    assert first_divergence([1, 2], [1, 2]) is None and first_divergence([1, 2], [1, 2, 3]) == 2
