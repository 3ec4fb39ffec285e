"""--context-points: only the first turn whose context reaches each point is decoded; the turns between are
prefilled with the next decoded one, never decoded, and recorded as skips with their reason."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.config import RunConfig
from evalsuite.errors import UserError
from evalsuite.run.runner import Runner
from tests.helpers import load_turns


def growing_conversation(path, turns: int = 6):
    """A logged conversation whose contexts grow by a long logged reply per turn."""
    messages = []
    for i in range(turns):
        messages += [{"role": "user", "content": f"Step {i}: list the files."},
                     {"role": "assistant", "content": " ".join(f"file_{i}_{j}.py" for j in range(12))}]
    path.write_text(json.dumps({"id": "grow", "messages": messages}) + "\n")
    return path


def run(target, tmp_path, points, **extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = growing_conversation(tmp_path / "grow.jsonl")
    out = tmp_path / "points"
    runner = Runner(RunConfig(methods=["ngram"], task="custom", data_path=str(data), target=str(target),
                              max_new_tokens=8, k=4, replay="logged", context_points=points, **extra), out)
    runner.load()
    runner.run()
    return load_turns(out)


def test_the_first_turn_at_or_past_each_point_is_decoded_and_the_rest_recorded(tiny_llama_dir, tmp_path):
    everything = run(tiny_llama_dir, tmp_path / "all", None)
    contexts = everything[everything.method == "ar"].set_index("turn").context_len.sort_index().tolist()
    # points between turn contexts: the first reaches turn 2, the second lands exactly on turn 4's context,
    # and a third beyond every context is never reached
    points = [contexts[1] + 1, contexts[4], contexts[-1] + 10_000]
    turns = run(tiny_llama_dir, tmp_path / "pts", points)
    assert len(turns) == 2 * 6  # every turn has a row per method (ngram, ar): decoded or a recorded skip
    decoded = turns[turns.stop_reason != "skipped"]
    assert sorted(set(decoded.turn)) == [2, 4]
    assert set(decoded.set_index("turn").context_point.items()) == {(2, points[0]), (4, points[1])}
    skipped = turns[turns.stop_reason == "skipped"]
    assert skipped[skipped.turn < 4].skip_reason.str.contains("between context points").all()
    assert skipped[skipped.turn > 4].skip_reason.str.contains("next point").all()  # the last point is unreached
    # the same contexts as a full replay (logged replies continue the history), prefilled incrementally
    ar = decoded[decoded.method == "ar"].set_index("turn")
    assert [ar.context_len[2], ar.context_len[4]] == [contexts[2], contexts[4]]
    first = decoded[decoded.position == 0].set_index("turn").prefill_tokens
    assert first[4] == contexts[4] - contexts[2]  # turn 3's context came in with turn 4's prefill


def test_context_points_are_checked(tiny_llama_dir, tmp_path):
    with pytest.raises(UserError, match="increasing"):
        RunConfig(methods=["ngram"], task="swebench", context_points=[4000, 2000]).validate()
    with pytest.raises(UserError, match="--replay free"):
        RunConfig(methods=["ngram"], task="swebench", replay="free", context_points=[2000]).validate()
    result = CliRunner().invoke(app, ["run", "--task", "swebench", "--context-points", "2k,four", "--out",
                                      str(tmp_path / "x")])
    assert result.exit_code == 2 and "--context-points 2k,four" in result.output
    data = tmp_path / "free.jsonl"
    data.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"},
                                                        {"role": "assistant", "content": "ho"},
                                                        {"role": "user", "content": "again"}]}) + "\n")
    runner = Runner(RunConfig(methods=["ngram"], task="mt-bench", target=str(tiny_llama_dir), limit=1,
                              context_points=[100]), tmp_path / "mt")
    with pytest.raises(UserError, match="use --replay logged"):
        runner.load()
