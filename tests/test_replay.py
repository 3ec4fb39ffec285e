"""Trajectory replay through the Runner on tiny targets: logged vs free history, and the context policies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalsuite.chat_format import fit_to_template
from evalsuite.config import RunConfig
from evalsuite.errors import UserError
from evalsuite.records import load_turns
from evalsuite.runner import Runner
from evalsuite.target import TargetModel
from evalsuite.testing import build_tiny_target
from evalsuite.workloads.swebench import BUNDLED

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
        render = runner._render

        def recording(messages, tools):
            capture.append([dict(m) for m in messages])
            return render(messages, tools)

        runner._render = recording
    runner.run()
    return runner


def test_logged_replay_context_is_the_logged_prefix(long_target_dir, tmp_path):
    seen: list = []
    runner = run(long_target_dir, tmp_path / "logged", seen, data_path=str(SWE_FILE), max_turns=3)
    assert runner.replay == "logged"  # swebench's default under --replay auto
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
    """Turn 0 fits a 256-position target; turn 1 (a 400-byte user message) does not."""
    record = {"id": "grow", "messages": [
        {"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": "x" * 400}, {"role": "assistant", "content": "Long."},
        {"role": "user", "content": "Bye."}]}
    path = tmp_path / "grow.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return path


def test_context_policy_stop_records_the_skip_and_ends_the_trajectory(short_target_dir, tmp_path):
    run(short_target_dir, tmp_path / "stop", task="custom", data_path=str(custom_file(tmp_path)))
    turns = load_turns(tmp_path / "stop")
    for method in ("ngram", "ar"):
        rows = turns[turns.method == method].sort_values("turn")
        assert list(rows.turn) == [0, 1]  # turn 2 never runs: the trajectory ended at turn 1
        assert rows.iloc[0].stop_reason in ("eos", "max_new_tokens") and rows.iloc[0].skip_reason == ""
        skipped = rows.iloc[1]
        assert skipped.stop_reason == "skipped" and skipped.new_tokens == 0
        assert "reaches the target maximum of 256" in skipped.skip_reason
        assert "--context-policy stop" in skipped.skip_reason
        assert skipped.context_len > 256 and skipped.dropped_tokens == 0


def test_context_policy_truncate_left_records_dropped_tokens(short_target_dir, tmp_path):
    run(short_target_dir, tmp_path / "trunc", task="custom", data_path=str(custom_file(tmp_path)),
        context_policy="truncate-left")
    turns = load_turns(tmp_path / "trunc")
    keep = 256 - 8 - 4 - 1  # max_context - max_new_tokens - k - 1
    for method in ("ngram", "ar"):
        rows = turns[turns.method == method].sort_values("turn")
        assert list(rows.turn) == [0, 1, 2]
        assert rows.iloc[0].dropped_tokens == 0
        for _, row in rows.iloc[1:].iterrows():
            assert row.context_len == keep and row.dropped_tokens > 0 and row.new_tokens > 0
            assert row.skip_reason == ""


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
