"""The plan's cost model (evalsuite/run/plan.py): measured at the contexts the plan reaches, prefill priced by its
place in the context. Asserts what is measured where and the arithmetic of the estimate, not how fast anything is."""

from __future__ import annotations

import pytest

from evalsuite.run import plan as plan_module
from evalsuite.run.plan import Costs, measure_costs, turn_costs
from evalsuite.target.model import TargetModel


class _Cfg:
    max_new_tokens = 10
    repeats = 2


def _costs(**changes) -> Costs:
    base = dict(decode_short_s=0.010, decode_long_s=0.030, short=64, long=10_064, prefill_per_token_s=0.001,
                method_ratio={"ar": 1.0, "dlite": 0.5}, prefill_tokens=1000, prefill_long_per_token_s=0.003)
    return Costs(**{**base, **changes})


def test_decode_and_prefill_follow_the_context():
    costs = _costs()
    assert costs.decode_s(64) == pytest.approx(0.010) and costs.decode_s(10_064) == pytest.approx(0.030)
    assert costs.decode_s(5_064) == pytest.approx(0.020)
    assert costs.decode_s(0) == pytest.approx(0.010)  # never below the short context's cost
    # a chunk centred where each rate was measured costs that rate per token
    assert costs.prefill_s(0, 1000) == pytest.approx(1.0)
    assert costs.prefill_s(10_064, 1000) == pytest.approx(3.0)
    # one long prefill costs more than its tokens at the start's rate: attention grows with the offset
    assert costs.prefill_s(0, 20_000) > 20_000 * 0.001 * 1.5
    # split or whole, a prefill from 0 to N is priced alike (the rate is linear in the offset)
    assert costs.prefill_s(0, 8_000) + costs.prefill_s(8_000, 8_000) == pytest.approx(costs.prefill_s(0, 16_000))
    assert costs.prefill_s(500, 0) == 0.0


def test_without_a_long_measurement_the_rates_are_flat():
    costs = _costs(prefill_long_per_token_s=None, long=1000, decode_long_s=0.010)
    assert costs.prefill_s(30_000, 1000) == pytest.approx(1.0)
    assert "after" not in costs.describe()


def test_turn_costs_price_each_turn_at_its_context():
    costs = _costs()
    turns = [(2_000, 2_000, ["ar", "dlite"]), (10_064, 8_064, ["ar", "dlite"])]
    first, second = turn_costs(costs, turns, _Cfg())
    assert first[1] == pytest.approx(costs.prefill_s(0, 2_000))
    assert second[1] == pytest.approx(costs.prefill_s(2_000, 8_064))
    assert second[0] - second[1] == pytest.approx(1.5 * 0.030 * 10 * 2)  # (ar + dlite's 0.5) × decode × tokens


def _record_forwards(monkeypatch, target):
    seen = []
    original = target.forward

    def forward(ids, cache, *args, **kwargs):
        seen.append((int(ids.numel()), int(cache.get_seq_length())))
        return original(ids, cache, *args, **kwargs)

    monkeypatch.setattr(target, "forward", forward)
    return seen


def test_costs_are_measured_at_the_plans_longest_context(tiny_llama_dir, monkeypatch):
    target = TargetModel.load(str(tiny_llama_dir))
    seen = _record_forwards(monkeypatch, target)
    chunk = max(128, min(1024, target.max_context // 4))
    longest = 1_400
    costs = measure_costs(target, {"ar": 0.01, "ngram": 0.005}, longest, repeats=3)
    assert costs.long == longest and costs.synthetic and costs.prefill_tokens == chunk
    assert costs.prefill_long_per_token_s is not None and costs.method_ratio["ngram"] == pytest.approx(0.5)
    # the long context is random K/V, never prefilled: every forward of `chunk` tokens starts at 0 or at `longest`
    assert (1, longest) in seen and (chunk, longest) in seen
    assert all(start in (0, 64, chunk, longest) for n, start in seen if n > 1)
    assert f"at {longest:,} (random K/V in the cache)" in costs.describe()


def test_a_short_plan_measures_no_long_context(tiny_llama_dir, monkeypatch):
    target = TargetModel.load(str(tiny_llama_dir))
    seen = _record_forwards(monkeypatch, target)
    costs = measure_costs(target, {}, 300, repeats=3)
    assert costs.prefill_long_per_token_s is None and not costs.synthetic
    assert max(start for _, start in seen) <= costs.prefill_tokens + 1


def test_a_cache_without_synthetic_fill_is_prefilled_up_to_a_cap(tiny_llama_dir, monkeypatch):
    target = TargetModel.load(str(tiny_llama_dir), kv_cache="dynamic")
    monkeypatch.setattr(plan_module, "PREFILLED_MAX", 1_000)
    seen = _record_forwards(monkeypatch, target)
    costs = measure_costs(target, {}, 1_400, repeats=3)
    assert costs.long == 1_000 and not costs.synthetic and costs.prefill_long_per_token_s is not None
    assert (1_000, 0) in seen and (1, 1_000) in seen


def _row(context: int, speedup: float, **changes):
    from types import SimpleNamespace
    return SimpleNamespace(**{"context_len": context, "speedup_turn": speedup, "stop_reason": "eos",
                              "contended": False, **changes})


def test_stored_turns_give_each_method_its_ratio_by_context():
    from evalsuite.run.plan import stored_ratios
    stored = {
        ("ar", "a"): [_row(c, 1.0) for c in (1_000, 2_000, 3_000)],
        ("dlite", "a"): [_row(1_000, 2.0), _row(1_100, 2.0), _row(1_200, 2.0)],
        ("dlite", "b"): [_row(9_000, 0.5), _row(9_100, 0.5),
                         _row(5_000, 0.1, contended=True), _row(5_000, float("nan")),
                         _row(5_000, 0.1, stop_reason="skipped"),
                         _row(9_200, 0.5, stop_reason="max_new_tokens")],
        ("ngram", "a"): [_row(1_000, 3.0), _row(2_000, 3.0)],  # too few: the warm-up's ratio stays
    }
    lines = stored_ratios(stored)
    assert set(lines) == {"dlite"}
    costs = _costs(stored_ratio=lines, method_ratio={"ar": 1.0, "dlite": 9.9, "ngram": 0.4})
    assert costs.ratio("dlite", 1_100) == pytest.approx(0.5)  # 1 / speedup
    assert costs.ratio("dlite", 9_100) == pytest.approx(2.0)
    assert costs.ratio("dlite", 5_100) == pytest.approx(1.25)  # halfway between the two bins
    assert costs.ratio("dlite", 50_000) == pytest.approx(2.0)  # flat past the stored range
    assert costs.ratio("ngram", 1_000) == pytest.approx(0.4) and costs.ratio("ar", 1_000) == 1.0
    text = costs.describe()
    assert "in the stored turns (1,100–9,100 tokens of context): dlite 0.50–2.00×" in text
    assert "in the warm-up: ngram 0.40×" in text and "dlite 9.90" not in text
