"""`--engine vllm` end to end on the default target, in eager mode (runs in CI: scripts/setup.sh installs
.venv-vllm): ar and ngram on two GSM8K samples and one SWE-bench trajectory of 3 turns, through vLLM and
through our engine. At T=0 vLLM's ar equals ours token for token (a divergence must be a near-tie of the
target's top-2 logits), vLLM's ngram equals vLLM's ar, and the records have our schema plus `engine`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.compare import compare_turns, divergence_margins
from evalsuite.store.records import STEP_SCHEMA, TURN_SCHEMA
from tests.helpers import load_steps, load_turns, requires_vllm

pytestmark = pytest.mark.vllm
cli = CliRunner()


CASES = {"gsm8k": ["--task", "gsm8k", "--limit", "2"],
         "swebench": ["--task", "swebench", "--limit", "1", "--max-turns", "3"]}


@pytest.fixture(scope="module", params=list(CASES))
def runs(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"vllm-{request.param}")
    common = ["run", "--method", "ar,ngram", "--max-new-tokens", "32", *CASES[request.param]]
    found = {}
    for engine in ("hf", "vllm"):
        out = root / engine
        result = cli.invoke(app, [*common, "--engine", engine, "--out", str(out)])
        assert result.exit_code == 0, result.output
        found[engine] = out
    return request.param, found


@requires_vllm
def test_vllm_records_have_our_schema_plus_engine(runs):
    task, dirs = runs
    turns, steps = load_turns(dirs["vllm"]), load_steps(dirs["vllm"])
    assert list(turns.columns) == TURN_SCHEMA.names and list(steps.columns) == STEP_SCHEMA.names
    assert set(turns.engine) == {"vllm"} and set(steps.engine) == {"vllm"}
    assert set(load_turns(dirs["hf"]).engine) == {"hf"}
    assert len(turns) == (4 if task == "gsm8k" else 6)
    assert steps.step_s.isna().all() and steps.verify_s.isna().all()  # vLLM has no per-step time: null
    decoded = turns[turns.stop_reason != "skipped"]
    assert (decoded.decode_s > 0).all() and decoded.speedup_turn.notna().all()
    for row in decoded.itertuples():  # the rebuilt steps tile the output: prefill token + every emitted one
        mine = steps[(steps.method == row.method) & (steps.sample_id == row.sample_id) & (steps.turn == row.turn)]
        assert 1 + mine.emitted.sum() == row.new_tokens
        assert mine.context_len.iloc[0] == row.context_len
    config = json.loads((dirs["vllm"] / "run.json").read_text())
    assert config["engine"] == "vllm" and config["vllm"]["prefix_caching"] is True
    assert config["vllm"]["steps_not_tiled_turns"] == 0


@requires_vllm
def test_vllm_ngram_is_lossless_and_vllm_ar_matches_ours(runs):
    task, dirs = runs
    both = compare_turns(load_turns(dirs["hf"]), load_turns(dirs["vllm"]), "hf", "vllm")
    assert len(both) == (4 if task == "gsm8k" else 6)
    assert both.equal_to_ar_vllm.all() and both.equal_to_ar_hf.all()
    both = divergence_margins(both, dirs["hf"], "hf", "default")
    diverged = both[~both.equal_ids & ~both.history_differs.astype(bool)]
    assert diverged.near_tie.fillna(False).all(), diverged[["method", "sample_id", "turn", "first_divergence",
                                                            "margin"]].to_string()
