"""Trajectory replay through the Runner on tiny targets: logged vs free history, and the context policies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalsuite.config import RunConfig
from evalsuite.errors import UserError
from evalsuite.target.chat import fit_to_template
from tests.helpers import load_turns
from evalsuite.run.runner import Runner
from evalsuite.target.model import TargetModel
from evalsuite.tasks.swebench import BUNDLED
from evalsuite.testing import build_tiny_target

SWE_ID = "django__django-13512"  # the shortest first three turns of the 30 (about 6.6k bytes)
SWE_FILE = BUNDLED["mini-swe-agent"] / SWE_ID / f"{SWE_ID}.traj.json"


@pytest.fixture(scope="module")
def long_target_dir(tmp_path_factory) -> Path:
    return build_tiny_target(tmp_path_factory.mktemp("tiny-8k"), "llama", max_positions=8192)


@pytest.fixture(scope="module")
def short_target_dir(tmp_path_factory) -> Path:
    return build_tiny_target(tmp_path_factory.mktemp("tiny-256"), "llama", max_positions=256)


def run(target_dir: Path, out: Path, capture: list | None = None, **overrides) -> Runner:
    options = dict(methods=["ngram", "ar"], task="swebench", target=str(target_dir), max_new_tokens=8, k=4,
                   warmup=False)
    options.update(overrides)
    runner = Runner(RunConfig(**options), out)
    runner.load()
    if capture is not None:
        render = runner.chat.render

        def recording(messages, tools=None, enable_thinking=False):
            capture.append([dict(m) for m in messages])
            return render(messages, tools, enable_thinking)

        runner.chat.render = recording
    runner.run()
    return runner


def test_logged_replay_context_is_the_logged_prefix(long_target_dir, tmp_path):
    seen: list = []
    runner = run(long_target_dir, tmp_path / "logged", seen, data_path=str(SWE_FILE), max_turns=3)
    assert runner.replay_mode == "logged"  # swebench's default under --replay auto
    messages = json.loads(SWE_FILE.read_text())["messages"]
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"][:3]
    expected = [[{"role": m["role"], "content": m["content"]} for m in messages[:i]] for i in assistants]
    # every method renders exactly messages[0 : i-th assistant] at turn i (two methods per turn)
    assert seen == [prefix for prefix in expected for _ in range(2)]
    turns = load_turns(tmp_path / "logged").sort_values(["method", "turn"])
    target = TargetModel.load(str(long_target_dir))
    lengths = [len(target.render(*fit_to_template(prefix, None, target.chat_template))) for prefix in expected]
    for method in ("ngram", "ar"):
        rows = turns[turns.method == method]
        assert list(rows.turn) == [0, 1, 2]
        assert list(rows.replay) == ["logged"] * 3
        assert list(rows.context_len) == lengths  # the context length before each turn, growing
        assert (rows.new_tokens > 0).all()


def test_free_replay_feeds_the_models_own_answer(long_target_dir, tmp_path):
    seen: list = []
    run(long_target_dir, tmp_path / "free", seen, data_path=str(SWE_FILE), max_turns=2, replay="free",
        methods=["ar"])
    turns = load_turns(tmp_path / "free").sort_values("turn")
    assert list(turns.replay) == ["free", "free"]
    target = TargetModel.load(str(long_target_dir))
    assert seen[1][2] == {"role": "assistant", "content": target.decode(turns.iloc[0].output_ids)}
    assert seen[1][3]["role"] == "user"  # the logged observation follows the model's own action


def custom_file(tmp_path: Path) -> Path:
    """Turns 0-1 fit a 256-position target; turn 2 only without turn 1's message; turn 3's 400-byte message fits
    under no policy; turns 4-5 (the last without a logged reply) fit again once older messages are dropped."""
    record = {"id": "grow", "messages": [
        {"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "a" * 100}, {"role": "assistant", "content": "A."},
        {"role": "user", "content": "b" * 100}, {"role": "assistant", "content": "B."},
        {"role": "user", "content": "x" * 400}, {"role": "assistant", "content": "X."},
        {"role": "user", "content": "c" * 100}, {"role": "assistant", "content": "C."},
        {"role": "user", "content": "Bye."}]}
    path = tmp_path / "grow.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return path


def rows_by_method(out: Path) -> dict:
    turns = load_turns(out)
    return {m: turns[turns.method == m].sort_values("turn").reset_index(drop=True) for m in ("ngram", "ar")}


def test_context_policy_stop_records_every_turn(short_target_dir, tmp_path):
    run(short_target_dir, tmp_path / "stop", task="custom", data_path=str(custom_file(tmp_path)))
    for rows in rows_by_method(tmp_path / "stop").values():
        assert list(rows.turn) == [0, 1, 2, 3, 4, 5]  # every turn has its row, decoded or skipped
        assert list(rows.stop_reason[:2].isin(["eos", "max_new_tokens"])) == [True, True]
        assert (rows.skip_reason[:2] == "").all()
        for skipped in rows.iloc[2:].itertuples():  # logged replay: each later context is longer still
            assert skipped.stop_reason == "skipped" and skipped.new_tokens == 0
            assert skipped.skip_reason == (f"context of {skipped.context_len} tokens reaches the target maximum "
                                           f"of 256 (--context-policy stop)")
            assert skipped.context_len > 255 and skipped.dropped_tokens == skipped.dropped_messages == 0
        assert list(rows.replay) == ["logged"] * 6


def test_context_policy_truncate_left_drops_whole_messages_and_goes_on(short_target_dir, tmp_path):
    seen: list = []
    run(short_target_dir, tmp_path / "trunc", seen, task="custom", data_path=str(custom_file(tmp_path)),
        context_policy="truncate-left")
    budget = 256 - 8 - 4 - 1  # max_context - max_new_tokens - k - 1
    for rows in rows_by_method(tmp_path / "trunc").values():
        assert list(rows.turn) == [0, 1, 2, 3, 4, 5]
        assert list(rows.stop_reason == "skipped") == [False, False, False, True, False, False]
        assert list(rows.dropped_messages) == [0, 0, 2, 0, 6, 6]  # whole agent steps: a reply + its answer
        decoded = rows[rows.stop_reason != "skipped"]
        assert (decoded.context_len <= budget).all() and (decoded.new_tokens > 0).all()
        assert (decoded.dropped_tokens > 0).tolist() == (decoded.dropped_messages > 0).tolist()
        assert rows.skip_reason[3].startswith("the 3 messages truncate-left keeps")
        assert "--context-policy truncate-left" in rows.skip_reason[3]
    kept = seen[-1]  # turn 5 (the policy renders the full history first, then what it keeps)
    assert [m["content"] for m in kept] == ["Say hi.", "X.", "c" * 100, "C.", "Bye."]


@pytest.mark.parametrize("policy", ["stop", "truncate-left"])
def test_free_replay_after_a_skip_records_the_rest_of_the_trajectory(short_target_dir, tmp_path, policy):
    out = tmp_path / policy
    run(short_target_dir, out, task="custom", data_path=str(custom_file(tmp_path)), replay="free",
        context_policy=policy)
    first_skip = 2 if policy == "stop" else 3
    for rows in rows_by_method(out).values():
        assert list(rows.turn) == [0, 1, 2, 3, 4, 5] and (rows.replay == "free").all()
        assert (rows.stop_reason[:first_skip] != "skipped").all()
        assert (rows.stop_reason[first_skip:] == "skipped").all()
        for reason in rows.skip_reason[first_skip + 1:]:
            assert reason == (f"turn {first_skip} was skipped and produced no reply (free replay), so this turn "
                              "has no history to continue from")


@pytest.mark.parametrize("replay", ["logged", "free"])
def test_a_decode_that_hits_the_window_mid_turn_still_leaves_every_row(short_target_dir, tmp_path, replay):
    out = tmp_path / "mid"
    run(short_target_dir, out, task="custom", data_path=str(custom_file(tmp_path)), max_new_tokens=240,
        replay=replay)
    for rows in rows_by_method(out).values():
        assert list(rows.turn) == [0, 1, 2, 3, 4, 5]
        assert rows.stop_reason[0] == "context_limit"  # 240 new tokens do not fit after the 26-token prompt
        assert rows.context_len[0] + rows.new_tokens[0] == 256
        if replay == "logged":  # turn 1's logged context still fits and runs into the window too
            assert rows.stop_reason[1] == "context_limit" and (rows.stop_reason[2:] == "skipped").all()
        else:  # turn 1 holds turn 0's long answer: no room; then no history to go on from
            assert (rows.stop_reason[1:] == "skipped").all()
            assert rows.skip_reason[1].endswith("reaches the target maximum of 256 (--context-policy stop)")
            assert rows.skip_reason[2].startswith("turn 1 was skipped")
    ar, ngram = (rows_by_method(out)[m] for m in ("ar", "ngram"))
    assert list(ar.output_ids[0]) == list(ngram.output_ids[0])


def test_raw_prompt_ids_are_checked_against_the_vocabulary(short_target_dir, tmp_path):
    path = tmp_path / "ids.jsonl"
    path.write_text(json.dumps({"id": "r", "prompt_ids": [1, 5, 300]}) + "\n")
    with pytest.raises(UserError, match="outside the target's vocabulary"):
        Runner(RunConfig(methods=["ar"], task="custom", target=str(short_target_dir), data_path=str(path),
                         warmup=False), tmp_path / "ids").load()
    path.write_text(json.dumps({"id": "r", "prompt_ids": [1, 5, 200]}) + "\n")
    run(short_target_dir, tmp_path / "raw", task="custom", data_path=str(path), methods=["ar"])
    row = load_turns(tmp_path / "raw").iloc[0]
    assert row.replay == "raw" and row.context_len == 3
