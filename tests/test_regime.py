"""`evalsuite regime` on planted cost surfaces and planted runs: break-even τ, projected speedup, the largest batch
that pays, memory-limited streams and the batch-1 validation, each against a value computed by hand."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.errors import UserError
from evalsuite.report.regime import (UTILISATION, load_cost, load_runs, payoff_table, projected_speedup,
                                     regime_table, validate, write_regime)
from tests.helpers import turn, write_run

K = 3
GIB = 1 << 30


def decode_ms(batch: int, context: int) -> float:
    return 10.0 + batch + context / 1000


def verify_ms(batch: int, context: int, block: int) -> float:
    return decode_ms(batch, context) * (1 + 0.1 * (block - 1))


def draft_ms(method: str, batch: int, context: int) -> float:
    return {"fast": 2.0 * batch, "slow": 9.0 + 0.001 * context}[method]


def write_cost(directory, unfit=((4, 4000),)):
    """A profile directory with planted costs; the (batch, context) points in `unfit` did not fit for `slow`."""
    directory.mkdir(parents=True, exist_ok=True)
    label = {"device": "test", "target": "shape:test", "dtype": "float32"}
    target = [{**label, "batch": b, "context": c, "block": n, "ms": verify_ms(b, c, n), "fits": True}
              for b in (1, 4) for c in (1000, 4000) for n in range(1, K + 2)]
    draft = []
    for method in ("fast", "slow"):
        for b in (1, 4):
            for c in (1000, 4000):
                fits = not (method == "slow" and (b, c) in unfit)
                draft.append({**label, "method": method, "batch": b, "context": c, "k": K,
                              "draft_ms": draft_ms(method, b, c) if fits else math.nan,
                              "state_bytes": (0 if method == "fast" else 200 * c) if fits else math.nan,
                              "fits": fits})
    pd.DataFrame(target).to_parquet(directory / "target_cost.parquet")
    pd.DataFrame(draft).to_parquet(directory / "draft_cost.parquet")
    run = {"kind": "profile", "target": "shape:test", "dtype": "float32", "spec": {"k": K},
           "device_memory_bytes": 100 * GIB, "weights_bytes": 16 * GIB, "kv_bytes_per_token": 100_000,
           "drafters": {"fast": {"weights_bytes": 0}, "slow": {"weights_bytes": GIB,
                                                            "state_calibration": {"per_token": 200.0, "fixed": 0.0}}}}
    (directory / "run.json").write_text(json.dumps(run))
    return directory


def test_break_even_tau_from_planted_costs(tmp_path):
    table = regime_table(load_cost(write_cost(tmp_path / "cost")))
    row = table.set_index(["method", "batch", "context"])
    for method in ("fast", "slow"):
        for b, c in ((1, 1000), (4, 1000), (1, 4000)):
            expected = (draft_ms(method, b, c) + verify_ms(b, c, K + 1)) / decode_ms(b, c)
            assert row.loc[(method, b, c)].tau_break_even == pytest.approx(expected, rel=1e-12)
            assert row.loc[(method, b, c)].k == K
    assert (row.loc["ar"].tau_break_even == 1.0).all()
    # the point that did not fit has no break-even (and is marked), the others do
    assert math.isnan(row.loc[("slow", 4, 4000)].tau_break_even) and not row.loc[("slow", 4, 4000)].fits
    assert row.loc[("fast", 4, 4000)].fits
    # no runs: nothing measured, nothing projected
    assert table.tau_measured.isna().all() and table.speedup_projected.isna().all()


def test_memory_limited_streams_from_planted_sizes(tmp_path):
    table = regime_table(load_cost(write_cost(tmp_path / "cost")))
    row = table.drop_duplicates(["method", "context"]).set_index(["method", "context"])
    free = 100 * GIB * UTILISATION - 16 * GIB
    for c in (1000, 4000):
        assert row.loc[("ar", c)].max_streams == int(free // (100_000 * c))
        assert row.loc[("fast", c)].max_streams == int(free // (100_000 * c))
        assert row.loc[("slow", c)].max_streams == int((free - GIB) // (100_000 * c + 200 * c))
    assert row.loc[("slow", 4000)].max_streams < row.loc[("fast", 4000)].max_streams


def test_projected_speedup_from_planted_acceptance_and_costs(tmp_path):
    cost = load_cost(write_cost(tmp_path / "cost"))
    # fast at ~1000 tokens: steps (drafted, accepted) = (3, 3), (3, 1), (0, 0) [found nothing: a block of 1]
    run = write_run(tmp_path / "run", "gsm8k", {
        "fast": {"s1": [turn([(3, 3), (3, 1), (0, 0)], context_len=1000)]},
        "slow": {"s1": [turn([(3, 2)], context_len=3900)]},
    })
    table = regime_table(cost, load_runs([run])).set_index(["method", "batch", "context"])
    for b in (1, 4):
        tokens = 4 + 2 + 1
        step_ms = 3 * draft_ms("fast", b, 1000) + 2 * verify_ms(b, 1000, 4) + verify_ms(b, 1000, 1)
        expected = tokens * decode_ms(b, 1000) / step_ms
        assert table.loc[("fast", b, 1000)].speedup_projected == pytest.approx(expected, rel=1e-12)
        assert table.loc[("fast", b, 1000)].tau_measured == pytest.approx(7 / 3)
    expected = 3 * decode_ms(1, 4000) / (draft_ms("slow", 1, 4000) + verify_ms(1, 4000, 4))
    assert table.loc[("slow", 1, 4000)].speedup_projected == pytest.approx(expected, rel=1e-12)
    assert math.isnan(table.loc[("slow", 4, 4000)].speedup_projected)  # did not fit
    assert math.isnan(table.loc[("fast", 1, 4000)].speedup_projected)  # no measured steps in that bin
    payoff = payoff_table(table.reset_index()).set_index(["method", "context"])
    paying = [b for b in (1, 4) if table.loc[("fast", b, 1000)].speedup_projected > 1]
    assert payoff.loc[("fast", 1000)].max_batch_paying == (max(paying) if paying else 0)


def test_budget_limited_steps_cost_no_draft():
    steps = pd.DataFrame({"context_len": [100, 100], "num_accepted": [2, 0], "num_drafted": [2, 0],
                          "budget_limited": [False, True]})
    value = projected_speedup(steps, lambda c: 5.0, lambda b, c: 10.0 + b, lambda c: 10.0)
    assert value == pytest.approx((3 + 1) * 10.0 / (5.0 + 13.0 + 11.0))


def test_validation_against_planted_paired_speedup(tmp_path):
    cost = load_cost(write_cost(tmp_path / "cost"))
    run = write_run(tmp_path / "run", "swebench", {
        "fast": {"s1": [turn([(3, 3), (3, 3)], context_len=1500, decode_s=1.0, new_tokens=8, ar_decode_s=2.4,
                             ar_new_tokens=8),
                        turn([(3, 0)], context_len=3000, decode_s=1.0, new_tokens=1, ar_decode_s=0.5,
                             ar_new_tokens=1)]},
    })
    table = validate(cost, load_runs([run]))
    assert list(table.columns[:7]) == ["task", "method", "context_lo", "context_hi", "speedup_measured",
                                       "speedup_projected", "rel_error"]
    assert len(table) == 1  # one bin [1000, 4000] holds both turns
    row = table.iloc[0]
    assert (row.context_lo, row.context_hi, row.turns, row.steps) == (1000, 4000, 2, 3)
    assert row.speedup_measured == pytest.approx((2.9 / 9) / (2.0 / 9))
    # costs interpolated linearly in the context at each step's own context (1500, 1504, 3000)
    contexts = [1500, 1504, 3000]
    blocks = [4, 4, 4]
    tokens = [4, 4, 1]
    draft = [2.0 for _ in contexts]
    verify = [verify_ms(1, c, n) for c, n in zip(contexts, blocks)]
    ar = sum(t * decode_ms(1, c) for t, c in zip(tokens, contexts))
    projected = ar / (sum(draft) + sum(verify))
    assert row.speedup_projected == pytest.approx(projected, rel=1e-9)
    assert row.rel_error == pytest.approx((projected - row.speedup_measured) / row.speedup_measured)


def test_regime_command_writes_tables_figures_and_validation(tmp_path):
    cost = write_cost(tmp_path / "cost")
    run = write_run(tmp_path / "run", "gsm8k", {"fast": {"s1": [turn([(3, 2)], context_len=1200)]}})
    result = CliRunner().invoke(app, ["regime", "--cost", str(cost), "--run", str(run), "--out",
                                      str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    regime = pd.read_csv(tmp_path / "out" / "regime.csv")
    assert list(regime.columns[:8]) == ["method", "batch", "context", "k", "tau_break_even", "tau_measured",
                                        "speedup_projected", "max_streams"]
    assert len(regime) == 3 * 2 * 2  # (ar, fast, slow) × batches × contexts
    for name in ("regime_validation.csv", "regime.md", "regime_tau_break_even.png", "regime_speedup.png",
                 "payoff.csv", "concurrency_memory.csv"):
        assert (tmp_path / "out" / name).is_file(), name
    bad = CliRunner().invoke(app, ["regime", "--cost", str(tmp_path), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "not a profile directory" in bad.output


def test_report_with_cost_adds_the_section(tmp_path):
    cost = write_cost(tmp_path / "cost")
    run = write_run(tmp_path / "run", "gsm8k", {"fast": {"s1": [turn([(3, 2)], context_len=1200)]},
                                                "ar": {"s1": [turn([(0, 0)] * 3, context_len=1200)]}})
    result = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "rep"), "--cost", str(cost),
                                      "--resamples", "100"])
    assert result.exit_code == 0, result.output
    assert "Where speculation pays" in (tmp_path / "rep" / "report.md").read_text()
    assert "Where speculation pays" in (tmp_path / "rep" / "index.html").read_text()
    assert (tmp_path / "rep" / "regime" / "regime.csv").is_file()


def test_missing_cost_files_are_one_line_errors(tmp_path):
    with pytest.raises(UserError, match="not a profile directory"):
        write_regime(tmp_path, [], tmp_path / "out")
