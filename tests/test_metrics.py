"""One definition of τ, speedup and pairing (evalsuite.metrics), and every consumer gets the same numbers from one
run: the runner's records, the Ray progress sums, the CLI summary, `evalsuite compare` and the report."""

from __future__ import annotations

from dataclasses import replace

import pytest

from evalsuite import metrics
from evalsuite.compare import engines_side_by_side
from evalsuite.config import RunConfig
from evalsuite.conventions import SKIPPED
from evalsuite.report import stats
from evalsuite.report.load import load_results
from evalsuite.report.summary import summary_rows
from evalsuite.run.runner import Progress, Runner
from evalsuite.store.records import TurnRecord
from evalsuite.store.run_store import read_run


def record(method: str, decode_s: float, new_tokens: int, stop_reason: str = "eos") -> TurnRecord:
    return TurnRecord(run_id="r", method=method, task="t", sample_id="s", turn=0, replay="free", context_len=10,
                      prompt_tokens=10, decode_s=decode_s, new_tokens=new_tokens, stop_reason=stop_reason)


def test_tau_counts_the_bonus_and_leaves_budget_limited_steps_out():
    assert metrics.tau_of([3, 0, 1], [False, True, False]) == pytest.approx((4 + 2) / 2)
    assert metrics.tau_sums([2, 2], [False, False]) == (6.0, 2)
    assert metrics.tau_of([], []) != metrics.tau_of([], [])  # NaN without a counted step


def test_tau_from_sums_and_break_even_tau_are_nan_where_undefined():
    assert metrics.tau_ratio(6.0, 2) == 3.0 and metrics.tau_ratio(0.0, 0) != metrics.tau_ratio(0.0, 0)
    assert metrics.tau_ratio([6.0, 0.0], [2, 0])[0] == 3.0
    assert metrics.step_tokens(2) == 3 and metrics.tau_of([1, 3]) == 3.0  # every step counts without flags
    assert metrics.tau_break_even(3.0 + 1.5, 2.0) == pytest.approx(2.25)
    for decode in (0.0, float("nan")):
        assert metrics.tau_break_even(4.5, decode) != metrics.tau_break_even(4.5, decode)
    assert metrics.tau_break_even([4.5, 1.0], [2.0, 0.0]).tolist()[0] == pytest.approx(2.25)


def test_ar_is_decoded_beside_every_other_method():
    assert metrics.with_baseline(["dlite", "ngram"]) == ["dlite", "ngram", "ar"]
    assert metrics.with_baseline(["ar", "dlite"]) == ["ar", "dlite"]
    assert metrics.with_baseline(["ar"]) == ["ar"] and metrics.with_baseline([]) == []
    assert metrics.with_baseline(m for m in ("suffix",)) == ["suffix", "ar"]


def test_pairing_is_one_function_of_a_turn_s_two_decodes():
    paired = metrics.turn_pairing((2.0, 10), 1.0, 10)
    assert paired == {"ar_decode_s": 2.0, "ar_new_tokens": 10, "speedup_turn": pytest.approx(2.0)}
    assert metrics.turn_pairing((2.0, 10), 2.0, 10)["speedup_turn"] == pytest.approx(1.0)
    empty = metrics.turn_pairing((2.0, 10), 0.0, 0)["speedup_turn"]
    assert empty != empty  # no tokens: NaN, not a division error
    alone = metrics.turn_pairing(None, 1.0, 10)  # no baseline decode of the turn: nothing to pair with
    assert alone["ar_decode_s"] == 0.0 and alone["ar_new_tokens"] == 0 and alone["speedup_turn"] != alone["speedup_turn"]


def test_speedup_is_pooled_over_turns_not_a_mean_of_ratios():
    import pandas as pd

    turns = pd.DataFrame([dict(stop_reason="eos", ar_decode_s=1.0, ar_new_tokens=10, decode_s=1.0, new_tokens=10),
                          dict(stop_reason="eos", ar_decode_s=3.0, ar_new_tokens=10, decode_s=1.0, new_tokens=10)])
    assert metrics.speedup(turns) == pytest.approx((4 / 20) / (2 / 20))  # 2.0, not the mean of 1 and 3


def test_every_consumer_gets_the_same_numbers_from_one_run(tiny_qwen3_dir, tmp_path):
    out = tmp_path / "run"
    runner = Runner(RunConfig(methods=["ngram", "ar"], task="mt-bench", target=str(tiny_qwen3_dir), limit=2,
                              max_new_tokens=24, k=4, out=str(out)), out)
    runner.load()
    progress_sums: dict[str, list] = {}
    runner.run(Progress(0, lambda info: progress_sums.setdefault(info["method"], []).append(info["tau_sums"])))
    tables = read_run(out)
    steps, turns = tables.steps, tables.turns

    for method in ("ngram", "ar"):
        mine_steps, mine_turns = steps[steps.method == method], turns[turns.method == method]
        tau = metrics.tau(mine_steps)
        speedup = metrics.speedup(mine_turns)
        # the runner: each turn's τ is the pooled τ of its steps
        for row in mine_turns.itertuples():
            turn_steps = mine_steps[(mine_steps.sample_id == row.sample_id) & (mine_steps.turn == row.turn)]
            assert row.tau == pytest.approx(metrics.tau(turn_steps))
        # the Ray progress bar: sums of the recorded steps, per turn as they are written
        total, count = (sum(x) for x in zip(*progress_sums[method]))
        assert total / count == pytest.approx(tau)
        # the CLI summary
        summary = {r["method"]: r for r in summary_rows(out)}[method]
        assert summary["tau"] == pytest.approx(tau) and summary["speedup"] == pytest.approx(speedup, nan_ok=True)
        # compare (the run against itself)
        side = engines_side_by_side(tables, tables, "a", "b").set_index("method").loc[method]
        assert side["tau a"] == pytest.approx(tau) and side["speedup a"] == pytest.approx(speedup, nan_ok=True)
        # the report
        results = load_results([out])
        cell = stats.summarize(results.steps, results.turns, n_resamples=100).set_index("method").loc[method]
        assert cell.tau == pytest.approx(tau) and cell.speedup == pytest.approx(speedup, nan_ok=True)
    assert metrics.speedup(turns[turns.method == "ar"]) == pytest.approx(1.0)
