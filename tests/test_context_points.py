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


def test_a_one_turn_document_is_decoded_at_every_point_as_nested_prefixes(tiny_llama_dir, tmp_path):
    """LongBench v2 at --context-points: turn i is point i, the item's context cut to the longest prefix whose
    rendered prompt (prefix, then the question) fits in the point; nested prefixes, so each point prefills only
    what the previous one lacks; a point past the whole prompt is a recorded skip."""
    from evalsuite.tasks.base import LoadOptions, get_task

    item = get_task("longbench-v2").load(LoadOptions(limit=1))[0]
    question = item.turns[0].new_messages[0]["content"][item.turns[0].cut_at:]
    assert question.startswith("\n\nQuestion: ")
    points = [256, 512, 1024, 10**7]
    out = tmp_path / "lb"
    runner = Runner(RunConfig(methods=["ngram"], task="longbench-v2", target=str(tiny_llama_dir),
                              max_new_tokens=4, k=4, context_points=points, sample_ids=[item.sample_id]), out)
    runner.load()
    runner.run()
    turns = load_turns(out)
    ar = turns[turns.method == "ar"].set_index("turn").sort_index()
    assert list(ar.index) == [0, 1, 2, 3]
    decoded = ar[ar.stop_reason != "skipped"]
    assert list(decoded.context_point) == points[:3]
    assert all(p - 8 <= n <= p for n, p in zip(decoded.context_len, points))  # filled to the point
    assert "short of the context point" in ar.skip_reason[3]
    assert (decoded.dropped_tokens > 0).all()
    first = turns[(turns.position == 0) & (turns.stop_reason != "skipped")].set_index("turn").prefill_tokens
    # nested prefixes: point 1 prefills only past point 0's cut (its question and template tail come again)
    assert decoded.context_len[1] - decoded.context_len[0] <= first[1] < decoded.context_len[1]
    replay = runner.replays(runner.trajectories[0], ("ar",))["ar"]
    for turn in (0, 2):  # the question is kept at the end of every cut, the document's start at its start
        text = runner.chat.decode(replay.context(turn).ids)
        assert question.strip()[-40:] in text and item.turns[0].new_messages[0]["content"][:40] in text
