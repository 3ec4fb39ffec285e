"""Degenerate turns (`evalsuite.degenerate`): a planted copy of an earlier reply and a planted loop are flagged with
their reason and ordinary replies are not; the runner's record carries the flag; stored flags are kept and missing
ones computed; dropping a flagged turn drops it for every method."""

from __future__ import annotations

import numpy as np

from evalsuite import degenerate
from evalsuite.replay import TurnContext
from evalsuite.report import decisions
from evalsuite.run.runner import Decode
from evalsuite.store.records import TurnKey, TurnResult
from tests.helpers import frames, steps_with_tau, turn_row


def replies():
    rng = np.random.default_rng(0)
    first = rng.integers(100, 5000, 64).tolist()
    copy = rng.integers(100, 5000, 10).tolist() + first[5:45] + rng.integers(100, 5000, 14).tolist()
    loop = rng.integers(100, 5000, 20).tolist() + [7, 8, 9] * 10 + rng.integers(100, 5000, 14).tolist()
    ordinary = rng.integers(100, 5000, 64).tolist()
    return [first, copy, loop, ordinary]


def run_frames(methods=("ngram", "dlite")):
    turn_rows, step_rows = [], []
    for method in methods + ("ar",):
        for t, ids in enumerate(replies()):
            turn_rows.append(turn_row(method, "s0", t, 1000 * (t + 1), output_ids=ids,
                                      decode_s=0.5 if method == "ngram" and t in (1, 2) else 1.0))
            step_rows += steps_with_tau(method, "s0", t, 1000 * (t + 1), 2.0, n_steps=4)
    return frames(turn_rows, step_rows)


def test_a_planted_repetition_turn_is_flagged_with_its_reason():
    steps, turns = run_frames()
    flagged = degenerate.flag_turns(turns)
    ngram = flagged[flagged.method == "ngram"].set_index("turn")
    assert ngram.degenerate.tolist() == [False, True, True, False]
    assert ngram.loc[1, "degenerate_reason"] == "copies 40 tokens of turn 0's reply"
    assert ngram.loc[2, "degenerate_reason"].startswith("loops: a 3-token pattern repeated 10.0×, 30 tokens")
    assert ngram.loc[3, "degenerate_reason"] == ""


def test_thresholds_and_helpers():
    assert degenerate.longest_common_run([1, 2, 3, 4, 9], [0, 2, 3, 4, 5]) == 3
    assert degenerate.longest_common_run([], [1, 2]) == 0
    assert degenerate.longest_loop([5] * 30) == (1, 30)
    assert degenerate.longest_loop([1, 2] * 5 + [3]) == (2, 10)
    assert degenerate.flag_reply([1, 2, 3] * 4, []) == (False, "")  # 12 tokens of loop: under 24
    assert degenerate.flag_reply([4] * 30, [])[0]
    assert not degenerate.flag_reply(list(range(40)), [(0, list(range(40)))], copy_min_tokens=41)[0]
    assert degenerate.flag_reply(list(range(40)), [(0, [9, 9]), (3, list(range(100)))]) == \
        (True, "copies 40 tokens of turn 3's reply")
    long = list(range(3000))  # a long reply against a long earlier one stays fast and exact
    assert degenerate.longest_common_run(long, [-1] + long[500:2500] + [-2]) == 2000


def test_the_runner_record_carries_the_flag_from_the_earlier_replies():
    key = TurnKey("r", "ngram", "mt-bench", "s0", 1)
    first = list(range(100, 164))

    def row(earlier, skip=""):  # as Runner._decode flags a decoded reply against the method's earlier ones
        context = TurnContext("free", list(range(10)), skip_reason=skip)
        result = None if skip else TurnResult(output_ids=first[:50])
        flag = degenerate.flag_reply(result.output_ids, earlier) if result else (False, "")
        return Decode(key, context, 0, "hf", "", "", result=result, degenerate=flag).row(None, last=False)

    record = row([(0, first)])
    assert record.degenerate and record.degenerate_reason == "copies 50 tokens of turn 0's reply"
    fresh = row([])
    assert not fresh.degenerate and fresh.degenerate_reason == ""
    skipped = row([(0, first)], skip="too long")
    assert not skipped.degenerate and skipped.stop_reason == "skipped" and skipped.skip_reason == "too long"


def test_stored_flags_are_kept_and_missing_ones_computed():
    _, turns = run_frames()
    turns["degenerate"] = turns.degenerate.astype(object)
    turns.loc[(turns.method == "ar") & (turns.turn == 3), "degenerate"] = True  # as a runner recorded it
    flagged = degenerate.flag_turns(turns)
    assert flagged[(flagged.method == "ar") & (flagged.turn == 3)].degenerate.item()
    assert flagged[(flagged.method == "dlite") & (flagged.turn == 3)].degenerate.item() is False
    assert flagged.degenerate.dtype == bool


def test_dropping_flagged_turns_drops_them_for_every_method_and_the_comparison_shows_both():
    steps, turns = run_frames()
    turns = degenerate.flag_turns(turns)
    kept_turns = degenerate.drop_flagged(turns, turns)
    assert sorted(kept_turns.turn.unique()) == [0, 3] and len(kept_turns) == 3 * 2
    assert sorted(degenerate.drop_flagged(steps, turns).turn.unique()) == [0, 3]
    table = decisions.degenerate_comparison(steps, turns, n_resamples=50).set_index("method")
    assert table.loc["ngram", "flagged_turns"] == 2
    assert table.loc["ngram", "n_turns"] == 4 and table.loc["ngram", "n_turns_without"] == 2
    # ngram was twice as fast on the two flagged turns only: without them it is as fast as ar
    assert table.loc["ngram", "speedup"] > 1.2 and table.loc["ngram", "speedup_without"] == 1.0
