"""The telemetry table on a planted run: memory, τ, marginal acceptance at 1/3/5, TTFT with the
shared prefill, ITL percentiles from step times, end-to-end turn latency and speedup."""

from __future__ import annotations

import numpy as np
import pytest

from evalsuite.report import telemetry
from tests.helpers import frames, step_row, turn_row

# (step_s, drafted, accepted): emitted = accepted + 1 -> 1, 3, 2, 1 tokens; plus the prefill's first token: 8
STEPS = [(0.100, 7, 0), (0.060, 7, 2), (0.200, 7, 1), (0.010, 7, 0)]
LIMITS = {"r": {"k": 7, "max_new_tokens": 64, "max_context": 8192}}


def planted():
    step_rows = [step_row("m", "s0", 0, i, 100 + i, d, a, step_s=s, verify_s=s, state_bytes=1000 * (i + 1))
                 for i, (s, d, a) in enumerate(STEPS)]
    step_rows += [step_row("ar", "s0", 0, i, 100 + i, 0, 0, step_s=0.05, verify_s=0.05) for i in range(7)]
    decode = sum(s for s, _, _ in STEPS) + 0.030
    turn_rows = [
        turn_row("ar", "s0", 0, 100, new_tokens=8, decode_s=0.35, prefill_s=0.0005, stop_reason="eos"),
        turn_row("m", "s0", 0, 100, new_tokens=8, decode_s=decode, prefill_s=0.400, prefill_tokens=100,
                 draft_prefill_s=0.030, ar_decode_s=0.35, ar_new_tokens=8, stop_reason="eos"),
    ]
    return frames(turn_rows, step_rows)


def test_telemetry_columns_on_a_planted_run():
    steps, turns = planted()
    table = telemetry.telemetry(steps, turns, LIMITS)
    assert list(table.columns[:len(telemetry.TELEMETRY_COLUMNS)]) == telemetry.TELEMETRY_COLUMNS
    assert list(table.method) == ["m", "ar"]
    m, ar = table.iloc[0], table.iloc[1]
    assert m.aux_memory_bytes == 4000 and ar.aux_memory_bytes == 0
    assert m.tau == pytest.approx(7 / 4)
    assert (m.acc_pos1, m.acc_pos3, m.acc_pos5) == pytest.approx((0.5, 0.0, 0.0))
    assert m.acc_pos1 == pytest.approx(2 / 4)  # over all four steps, not only those that reached position 1
    # TTFT: the shared prefill (paid by m, which ran first) + the drafter's start-of-turn work; ar pays the prefill
    assert m.ttft_ms == pytest.approx(430.0) and ar.ttft_ms == pytest.approx(400.0)
    # ITL amortized: 0.1 (1 token), 0.02 x 3, 0.1 x 2, 0.01 (1 token)
    itl = np.array([0.1, 0.02, 0.02, 0.02, 0.1, 0.1, 0.01])
    assert m.itl_p50_ms == pytest.approx(1e3 * np.percentile(itl, 50)) == pytest.approx(20.0)
    assert m.itl_p95_ms == pytest.approx(1e3 * np.percentile(itl, 95)) == pytest.approx(100.0)
    assert ar.itl_p50_ms == pytest.approx(50.0) and ar.itl_p95_ms == pytest.approx(50.0)
    # end to end: prefill + decode; TTFT + Σ ITL = the turn's latency (decode = draft prefill + Σ step_s)
    assert m.turn_latency_ms == pytest.approx(400 + 1e3 * (0.37 + 0.03))
    assert m.ttft_ms + 1e3 * itl.sum() == pytest.approx(m.turn_latency_ms)
    assert m.speedup == pytest.approx((0.35 / 8) / (0.40 / 8)) and ar.speedup == 1.0
    assert ar.tau == pytest.approx(1.0) and np.isnan(ar.acc_pos1)


def test_itl_burst_convention_and_unknown_prefill():
    steps, turns = planted()
    values, weights = telemetry.itl_values(steps[steps.method == "m"], "burst")
    burst = np.array([0.1, 0.06, 0.2, 0.01, 0.0, 0.0, 0.0])
    assert telemetry.weighted_percentile(values, weights, 50) == pytest.approx(np.percentile(burst, 50))
    assert telemetry.weighted_percentile(values, weights, 95) == pytest.approx(np.percentile(burst, 95))
    with pytest.raises(ValueError):
        telemetry.itl_values(steps, "mean")
    # the row that paid the shared prefill is filtered away: TTFT is unknown, not the 0.5 ms of a cache hit
    only_ar = telemetry.telemetry(steps[steps.method == "ar"], turns[turns.method == "ar"], LIMITS)
    assert np.isnan(only_ar.ttft_ms.iloc[0]) and np.isnan(only_ar.turn_latency_ms.iloc[0])
