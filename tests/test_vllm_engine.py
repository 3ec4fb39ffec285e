"""--engine vllm without vLLM: step rebuilding, method checks, checkpoint conversion, compare, error lines.

The end-to-end run through vLLM itself is tests/test_vllm_integration.py (it needs .venv-vllm)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.engines import vllm_engine
from evalsuite.engines.compare import compare_turns, engines_side_by_side, first_divergence
from evalsuite.engines.vllm_steps import rebuild_steps
from evalsuite.errors import UserError
from evalsuite.records import TURN_SCHEMA, STEP_SCHEMA, StepRecord, TurnRecord

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
    with pytest.raises(UserError, match=r"vLLM runs ar, ngram, eagle3"):
        vllm_engine.check_methods(["ar", method])
    vllm_engine.check_methods(["ar", "ngram", "eagle3"])


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


def _turns(rows):
    base = dict(task="t", replay="free", stop_reason="eos", speedup=1.0, new_tokens=3)
    return pd.DataFrame([{**base, **r} for r in rows])


def test_compare_reports_divergence_tau_speedup_and_losslessness():
    a = _turns([dict(method="ar", sample_id="s", turn=0, output_ids=[1, 2, 3], tau=1.0),
                dict(method="ngram", sample_id="s", turn=0, output_ids=[1, 2, 3], tau=1.5, speedup=1.2),
                dict(method="ngram", sample_id="s", turn=1, output_ids=[4, 5], tau=2.0, speedup=1.4)])
    b = _turns([dict(method="ar", sample_id="s", turn=0, output_ids=[1, 2, 9], tau=1.0),
                dict(method="ngram", sample_id="s", turn=0, output_ids=[1, 2, 9], tau=1.25, speedup=1.1),
                dict(method="ngram", sample_id="s", turn=1, output_ids=[4, 6], tau=3.0, speedup=0.9)])
    both = compare_turns(a, b, "hf", "vllm")
    row = both[(both.method == "ngram") & (both.turn == 0)].iloc[0]
    assert not row.equal_ids and row.first_divergence == 2 and row.tau_hf == 1.5 and row.tau_vllm == 1.25
    assert row.equal_to_ar_hf and row.equal_to_ar_vllm
    later = both[(both.method == "ngram") & (both.turn == 1)].iloc[0]
    assert later.history_differs  # free replay after a diverged turn: different histories
    side = engines_side_by_side(a, b, "hf", "vllm").set_index("method")
    assert side.loc["ngram", "equal ids"] == "0/2" and side.loc["ngram", "tau vllm"] == pytest.approx(2.125)
    assert first_divergence([1, 2], [1, 2]) is None and first_divergence([1, 2], [1, 2, 3]) == 2
