"""`evalsuite concurrency`: trajectories kept in flight through vLLM (.venv-vllm; skipped without it) on a tiny
target: one row per (method, level), the same work at every level, speedups against vLLM's own ar; and the
one-line refusals that need no vLLM."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.concurrency import measures, with_speedups
from evalsuite.testing import build_tiny_target
from tests.helpers import requires_vllm

cli = CliRunner()


@pytest.mark.vllm
@requires_vllm
def test_concurrency_sweep_writes_one_row_per_method_and_level(tmp_path):
    # head_dim 64: vLLM's CPU attention does not take the smallest tiny targets' head_dim 16
    target = build_tiny_target(tmp_path / "tiny", arch="qwen3", layers=2, hidden_size=256, heads=4, kv_heads=2,
                               intermediate=256)
    out = tmp_path / "sweep"
    result = cli.invoke(app, ["concurrency", "--target", str(target), "--method", "ngram", "--task", "gsm8k",
                              "--limit", "3", "--max-new-tokens", "16", "--concurrency", "1,2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "concurrency.csv")
    assert list(table.columns) == ["engine", "method", "concurrency", "trajectories", "requests", "output_tokens",
                                   "wall_s", "throughput_tok_s", "itl_ms_p50", "itl_ms_p95", "ttft_ms_p50", "tau",
                                   "speedup_throughput", "speedup_itl"]
    assert sorted(zip(table.method, table.concurrency)) == [("ar", 1), ("ar", 2), ("ngram", 1), ("ngram", 2)]
    assert (table.requests == 3).all() and (table.throughput_tok_s > 0).all()
    assert (table.itl_ms_p95 >= table.itl_ms_p50).all()
    # the same prompts at every level and with every method: greedy, lossless, so the same tokens
    assert table.output_tokens.nunique() == 1
    ar = table[table.method == "ar"]
    assert (ar.speedup_throughput == 1.0).all() and (ar.tau == 1.0).all()
    assert (table[table.method == "ngram"].tau >= 1.0).all()
    run = json.loads((out / "run.json").read_text())
    assert run["kind"] == "concurrency" and run["concurrency_levels"] == [1, 2] and run["engine"] == "vllm"
    assert "emptied before every" in run["prefix_cache"]
    assert not (out / "turns.parquet").exists()  # its own table, not a run's


def test_measures_from_planted_replies():
    replies = [{"output_ids": [1, 2, 3, 4, 5], "timing": {"queued_ts": 0.0, "scheduled_ts": 0.1,
                                                          "first_token_ts": 0.5, "last_token_ts": 0.9},
                "steps": [{"num_accepted": 2}, {"num_accepted": 0}]},
               {"output_ids": [1, 2, 3], "timing": {"queued_ts": 1.0, "scheduled_ts": 1.0, "first_token_ts": 1.2,
                                                    "last_token_ts": 1.6}, "steps": [{"num_accepted": 1}]}]
    row = measures(replies, 2.0, "ngram", 4, 2)
    assert row["output_tokens"] == 8 and row["throughput_tok_s"] == 4.0
    assert row["itl_ms_p50"] == pytest.approx((100 + 200) / 2)  # 0.4 s / 4 gaps and 0.4 s / 2 gaps
    assert row["ttft_ms_p50"] == pytest.approx((500 + 200) / 2)
    assert row["tau"] == pytest.approx((3 + 3) / 3)
    table = with_speedups(pd.DataFrame([row, {**row, "method": "ar", "throughput_tok_s": 2.0, "itl_ms_p50": 300.0}]))
    assert table.speedup_throughput.tolist() == pytest.approx([2.0, 1.0])
    assert table.speedup_itl.tolist() == pytest.approx([2.0, 1.0])


def test_refusals_are_one_line(tmp_path):
    result = cli.invoke(app, ["concurrency", "--engine", "hf", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "one stream at a time" in result.output
    result = cli.invoke(app, ["concurrency", "--method", "dlite", "--out", str(tmp_path / "y")])
    assert result.exit_code == 2 and "dlite" in result.output and "vLLM" in result.output
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
