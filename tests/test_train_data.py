"""Training data: ShareGPT recovery from a truncated file, and the held-out list that keeps every evaluation
sample out of the training prompts."""

from __future__ import annotations

import json

import pytest

from evalsuite.train import data, mixture
from evalsuite.tasks.base import TASKS, LoadOptions, get_task


@pytest.fixture(scope="module")
def heldout():
    return data.build_heldout()


def test_truncated_json_array_yields_the_complete_records():
    records = [{"id": i, "conversations": [{"from": "human", "value": f"q{i}"}]} for i in range(3)]
    text = json.dumps(records, indent=1)
    cut = text[: text.index('"q2"') + 2]  # the third record is cut off mid-string
    assert [r["id"] for r in data.iter_json_array_prefix(cut)] == [0, 1]
    assert [r["id"] for r in data.iter_json_array_prefix(text)] == [0, 1, 2]


def test_every_registered_task_is_in_the_heldout_list(heldout):
    get_task("gsm8k")
    loaded = {name for name in TASKS if name not in heldout.unavailable}
    assert {"gsm8k", "mt-bench"} <= loaded
    counted = heldout.summary()["samples_per_task"]
    for name in loaded:
        trajectories = TASKS[name].load(LoadOptions())
        assert counted[name] == len(trajectories), name
        for trajectory in trajectories[:25]:  # each sample's own prompt text is recognised as held out
            texts = [t for t in data.trajectory_texts(trajectory) if len(data._words(t)) >= data.MIN_HELDOUT_WORDS]
            assert all(heldout.overlaps(t) for t in texts), (name, trajectory.sample_id)


def test_selection_drops_evaluation_prompts_and_keeps_clean_ones(tmp_path, heldout):
    gsm8k = get_task("gsm8k").load(LoadOptions(limit=1, seed=3))[0].turns[0].new_messages[0]["content"]
    question = gsm8k.split("\nPlease reason")[0]
    mt_bench = get_task("mt-bench").load(LoadOptions(limit=1, seed=5))[0].turns[0].new_messages[0]["content"]
    words = mt_bench.split()
    assert len(words) >= 13
    clean = "Write a short poem about the autumn wind in the mountains near a quiet lake at dusk."
    path = tmp_path / "mix.jsonl"
    rows = [{"prompt": question},  # an evaluation question, verbatim
            {"prompt": "Hi! " + " ".join(words[:13]) + " Thanks."},  # a 13-word span of an evaluation prompt
            {"messages": [{"role": "user", "content": clean}]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    selected = mixture.select_prompts([str(path)], heldout, data.PromptOptions(num_prompts=10))
    assert [c.messages[-1][1] for c in selected.conversations] == [clean]
    assert selected.stats["dropped_heldout"] == 2


def test_math_like_prompts_get_the_evaluation_format(tmp_path, heldout):
    path = tmp_path / "math.jsonl"
    path.write_text(json.dumps({"prompt": "A farmer has 12 cows and buys 7 more each week. How many cows after "
                                          "3 weeks?"}) + "\n")
    selected = mixture.select_prompts([str(path)], heldout, data.PromptOptions(num_prompts=1))
    assert selected.conversations[0].messages[-1][1].endswith(data.MATH_SUFFIX)


def test_extra_math_prompts_come_after_an_unchanged_main_selection(tmp_path, heldout):
    path = tmp_path / "mixed.jsonl"
    chat = [{"prompt": f"Tell me a short story about a {animal} who learns to sing."}
            for animal in ("cat", "dog", "fox", "owl", "bee", "elk")]
    math = [{"prompt": f"A shop sells {n} pens each day. How many pens does it sell in {n + 3} days?"}
            for n in range(2, 6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in chat + math))
    main = mixture.select_prompts([str(path)], heldout, data.PromptOptions(num_prompts=3))
    more = mixture.select_prompts([str(path)], heldout, data.PromptOptions(num_prompts=3, extra_math_prompts=2))
    assert more.conversations[:3] == main.conversations
    extra = more.conversations[3:]
    assert len(extra) == 2 and more.stats["extra_math"] == 2 and more.stats["main_selection"] == 3
    assert all(c.messages[-1][1].endswith(data.MATH_SUFFIX) for c in extra)
    assert not {c.conv_id for c in extra} & {c.conv_id for c in main.conversations}


def test_math_only_keeps_the_math_like_prompts_of_an_unchanged_selection(tmp_path, heldout):
    path = tmp_path / "mixed.jsonl"
    chat = [{"prompt": f"Tell me a short story about a {animal} who learns to sing."}
            for animal in ("cat", "dog", "fox", "owl")]
    math = [{"prompt": f"A shop sells {n} pens each day. How many pens does it sell in {n + 3} days?"}
            for n in range(2, 5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in chat + math))
    full = mixture.select_prompts([str(path)], heldout, data.PromptOptions(num_prompts=7))
    subset = full.math_subset()
    assert [c.conv_id for c in subset.conversations] == [c.conv_id for c in full.conversations
                                                         if c.messages[-1][1].endswith(data.MATH_SUFFIX)]
    assert len(subset.conversations) == 3 and all("pens" in c.messages[-1][1] for c in subset.conversations)
    assert subset.stats["subset"]["kept"] == 3 and subset.stats["subset"]["of"] == 7
    assert {k: v for k, v in subset.stats.items() if k != "subset"} == full.stats


def test_math_only_leaves_the_default_work_dir_keys_unchanged(tmp_path):
    from types import SimpleNamespace

    from evalsuite.train.pipeline import TrainRequest, work_dir_for

    target = SimpleNamespace()
    base = dict(method="dlite", target="default", data=["sharegpt"], out=tmp_path / "out", work_dir=None, steps=1,
                overrides={})
    plain = work_dir_for(TrainRequest(**base, prompts=data.PromptOptions()), target, "sha")
    again = work_dir_for(TrainRequest(**base, prompts=data.PromptOptions(math_only=False)), target, "sha")
    math = work_dir_for(TrainRequest(**base, prompts=data.PromptOptions(math_only=True)), target, "sha")
    assert plain == again and math != plain


def test_bad_training_records_are_one_line_errors(tmp_path):
    from evalsuite.errors import UserError

    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "no prompt here"}) + "\n")
    with pytest.raises(UserError, match="bad.jsonl:1"):
        data.load_jsonl_conversations(path)
    with pytest.raises(UserError, match="no such file"):
        mixture.select_prompts([str(tmp_path / "missing.jsonl")], data.HeldOut(), data.PromptOptions())


def test_the_shipped_drafters_training_prompts_avoid_every_evaluation_sample(heldout):
    from evalsuite.tasks.base import DATA_DIR

    prompts = data.PromptSet.read(DATA_DIR / "training" / "training-prompts.jsonl")
    assert len(prompts) == 1344
    for conv in prompts:
        for _, text in conv.messages:
            assert not heldout.overlaps(text.removesuffix(data.MATH_SUFFIX)), conv.conv_id
