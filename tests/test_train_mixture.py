"""Training data mixtures (`--data sharegpt:0.3,swe:PATH:0.5,...`), agent trajectories as training contexts, their
held-out checks (evaluation ids and 13-gram overlap), long contexts, and the data sha256 in the model card."""

from __future__ import annotations

import gzip
import hashlib
import json
import random

import numpy as np
import torch
import pytest

from evalsuite.errors import UserError
from evalsuite.tasks.base import LoadOptions, get_task
from evalsuite.train import data, mixture

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec "
         "romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def sentence(rng: random.Random, n: int = 20) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)) + f" {rng.randrange(10**9)}"


def write_jsonl(path, rows, compress: bool = False):
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if compress:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def agent_rows(prefix: str, count: int, turns: int = 6, seed: int = 0, tool_calls: bool = False) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for t in range(count):
        messages = [{"role": "system", "content": "You are an agent. " + sentence(rng)},
                    {"role": "user", "content": sentence(rng, 40)}]
        for k in range(turns):
            if tool_calls and k % 2:
                messages.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": f"c{k}", "type": "function", "function": {"name": "lookup", "arguments": "{\"k\": 1}"}}]})
                messages.append({"role": "tool", "tool_call_id": f"c{k}", "name": "lookup", "content": sentence(rng)})
            else:
                messages.append({"role": "assistant", "content": sentence(rng, 30)})
                messages.append({"role": "user", "content": sentence(rng, 60)})
        rows.append({"id": f"{prefix}-{t}", "messages": messages})
    return rows


def chat_rows(count: int, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    return [{"messages": [{"role": "user", "content": "Please write about " + sentence(rng)}]} for _ in range(count)]


@pytest.fixture(scope="module")
def heldout():
    return data.build_heldout()


# ---- the --data parser ------------------------------------------------------------------------------------------
def test_data_items_parse_into_named_weighted_sources(tmp_path):
    swe = write_jsonl(tmp_path / "swe_train.jsonl.gz", agent_rows("s", 1), compress=True)
    tau = write_jsonl(tmp_path / "tau.jsonl", agent_rows("t", 1))
    specs = mixture.parse_data_spec(["sharegpt:0.3", f"swe:{swe}:0.5", f"{tau}:0.2"])
    assert specs == [mixture.DataSource("sharegpt", "sharegpt", 0.3), mixture.DataSource("swe", str(swe), 0.5),
                     mixture.DataSource("tau", str(tau), 0.2)]
    assert mixture.parse_data_spec(["sharegpt", f"agents:{tau}"]) == [
        mixture.DataSource("sharegpt", "sharegpt", None), mixture.DataSource("agents", str(tau), None)]
    assert mixture.is_trajectory_file(specs[1]) and not mixture.is_trajectory_file(specs[0])


@pytest.mark.parametrize("items, message", [
    (["sharegpt:0.3", "nosuch.jsonl:0.7"], "no such file"),
    (["sharegpt:0.5", "TAU"], "give a weight to every source or to none"),
    (["sharegpt:0"], "must be > 0"),
    (["sharegpt", "sharegpt"], "names repeat"),
])
def test_bad_data_items_are_one_line_errors(items, message, tmp_path):
    tau = write_jsonl(tmp_path / "tau.jsonl", agent_rows("t", 1))
    items = [str(tau) if i == "TAU" else i for i in items]
    with pytest.raises(UserError, match=message):
        mixture.parse_data_spec(items)


def test_trajectory_records_need_ids_and_known_roles(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"id": "a", "messages": [{"role": "system", "content": "x"},
                                                                          {"role": "robot", "content": "y"}]}])
    with pytest.raises(UserError, match="bad.jsonl:1: message 1 needs a role"):
        mixture.load_trajectories(str(path))
    path = write_jsonl(tmp_path / "noid.jsonl", [{"messages": [{"role": "system", "content": "x"}]}])
    with pytest.raises(UserError, match="needs an 'id'"):
        mixture.load_trajectories(str(path))


# ---- contexts from trajectories ---------------------------------------------------------------------------------
def test_trajectory_contexts_end_before_an_assistant_reply_and_keep_tool_calls(tmp_path):
    rows = agent_rows("t", 5, tool_calls=True)
    path = write_jsonl(tmp_path / "tau.jsonl.gz", rows, compress=True)
    selected = mixture.select_prompts([f"tau:{path}"], data.HeldOut(),
                                   data.PromptOptions(num_prompts=12, max_context_tokens=100_000))
    by_id = {r["id"]: r["messages"] for r in rows}
    assert len(selected.conversations) == 12
    for conv in selected.conversations:
        traj_id, cut = conv.conv_id.removeprefix("tau-").rsplit("-m", 1)
        full = by_id[traj_id]
        assert full[int(cut)]["role"] == "assistant" and conv.as_messages() == full[: int(cut)]
    # round trip through prompts.jsonl keeps the exact messages (tool calls, tool names)
    selected.write(tmp_path / "prompts.jsonl")
    assert data.PromptSet.read(tmp_path / "prompts.jsonl") == selected.conversations
    assert any(m.get("tool_calls") for c in selected.conversations for m in c.as_messages())


def test_context_window_bounds_the_cut_points(tmp_path):
    path = write_jsonl(tmp_path / "swe.jsonl", agent_rows("s", 6, turns=10))
    options = data.PromptOptions(num_prompts=1000, min_context_tokens=600, max_context_tokens=1500,
                                 max_per_trajectory=20)
    selected = mixture.select_prompts([str(path)], data.HeldOut(), options)
    sizes = [sum(len(text) for _, text in c.messages) for c in selected.conversations]
    assert sizes and min(sizes) >= 600 * mixture.CHARS_PER_TOKEN and max(sizes) <= 1500 * mixture.CHARS_PER_TOKEN
    assert selected.stats["exhausted"] == ["swe"]  # asked for more than there are: named, not silent


def test_max_trajectories_takes_every_cut_from_few_trajectories(tmp_path):
    """--max-trajectories N: contexts come from N trajectories only, up to max_per_trajectory cuts each; every cut
    of one trajectory is a prefix of its later ones (what lets the feature pass share one forward)."""
    path = write_jsonl(tmp_path / "swe.jsonl", agent_rows("s", 12, turns=10))
    options = data.PromptOptions(num_prompts=1000, min_context_tokens=100, max_context_tokens=10**6,
                                 max_per_trajectory=5, max_trajectories=3)
    selected = mixture.select_prompts([f"swe:{path}"], data.HeldOut(), options)
    by_trajectory: dict[str, list] = {}
    for c in selected.conversations:
        by_trajectory.setdefault(c.conv_id.rsplit("-m", 1)[0], []).append(c)
    assert len(by_trajectory) == 3 and all(len(cuts) == 5 for cuts in by_trajectory.values())
    assert selected.stats["mixture"]["swe"]["trajectories_used"] == 3
    for cuts in by_trajectory.values():
        cuts.sort(key=lambda c: len(c.messages))
        for shorter, longer in zip(cuts, cuts[1:]):
            assert longer.messages[:len(shorter.messages)] == shorter.messages
    every = mixture.select_prompts([f"swe:{path}"], data.HeldOut(), data.PromptOptions(
        num_prompts=1000, min_context_tokens=100, max_context_tokens=10**6, max_per_trajectory=5))
    assert len({c.conv_id.rsplit("-m", 1)[0] for c in every.conversations}) == 12


# ---- weights ----------------------------------------------------------------------------------------------------
def test_mixture_proportions_follow_the_weights(tmp_path):
    chat = write_jsonl(tmp_path / "chat.jsonl", chat_rows(800))
    swe = write_jsonl(tmp_path / "swe.jsonl", agent_rows("s", 200, turns=4, seed=2))
    tau = write_jsonl(tmp_path / "tau.jsonl", agent_rows("t", 200, turns=4, seed=3, tool_calls=True))
    n = 600
    selected = mixture.select_prompts([f"chat:{chat}:0.3", f"swe:{swe}:0.5", f"tau:{tau}:0.2"], data.HeldOut(),
                                   data.PromptOptions(num_prompts=n, max_context_tokens=100_000))
    counts = {name: sum(c.source == name for c in selected.conversations) for name in ("chat", "swe", "tau")}
    assert sum(counts.values()) == n and not selected.stats["exhausted"]
    for name, weight in (("chat", 0.3), ("swe", 0.5), ("tau", 0.2)):
        sd = (weight * (1 - weight) / n) ** 0.5
        assert abs(counts[name] / n - weight) < 4 * sd, counts  # binomial: 4 sigma
        assert selected.stats["mixture"][name]["share"] == counts[name] / n
    # the same seed gives the same selection; another seed another one
    again = mixture.select_prompts([f"chat:{chat}:0.3", f"swe:{swe}:0.5", f"tau:{tau}:0.2"], data.HeldOut(),
                                data.PromptOptions(num_prompts=n, max_context_tokens=100_000))
    other = mixture.select_prompts([f"chat:{chat}:0.3", f"swe:{swe}:0.5", f"tau:{tau}:0.2"], data.HeldOut(),
                                data.PromptOptions(num_prompts=n, max_context_tokens=100_000, seed=1))
    assert again.conversations == selected.conversations != other.conversations


def test_sources_are_hashed(tmp_path):
    swe = write_jsonl(tmp_path / "swe.jsonl.gz", agent_rows("s", 3), compress=True)
    chat = write_jsonl(tmp_path / "chat.jsonl", chat_rows(5))
    for items in ([f"swe:{swe}:0.5", f"{chat}:0.5"], [str(chat)]):  # mixture and the plain chat path
        selected = mixture.select_prompts(items, data.HeldOut(), data.PromptOptions(num_prompts=4,
                                                                                 max_context_tokens=100_000))
        for source in selected.stats["sources"]:
            path = swe if source["file"] == swe.name else chat
            assert source["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
            assert "/" not in source["file"]


# ---- held out ---------------------------------------------------------------------------------------------------
def test_trajectories_of_evaluation_samples_and_overlapping_contexts_are_dropped(tmp_path, heldout):
    swebench = get_task("swebench").load(LoadOptions())
    eval_id = swebench[0].sample_id.removeprefix("swebench-")
    eval_texts = data.trajectory_texts(swebench[1])
    system_prompt = swebench[2].turns[0].new_messages[0]["content"]  # shared by every evaluation trajectory
    spans = [w[i:i + 13] for w in map(data._words, eval_texts) for i in range(len(w) - 12)]
    leak = " ".join(next(g for g in spans if data._gram_hash(g) not in heldout.template))  # this sample's own text
    rows = agent_rows("clean", 3)
    rows.append({**agent_rows("x", 1, seed=9)[0], "id": eval_id})  # an evaluation instance, by id
    leaky = agent_rows("leak", 1, seed=10)[0]
    leaky["id"] = "leak-0"
    leaky["messages"][3]["content"] += " " + leak  # 13 words of an evaluation trajectory in an observation
    rows.append(leaky)
    templated = agent_rows("tmpl", 1, seed=11)[0]
    templated["id"] = "tmpl-0"
    templated["messages"][0]["content"] = system_prompt  # the agent's system prompt alone is no sample's text
    rows.append(templated)
    path = write_jsonl(tmp_path / "swe.jsonl", rows)
    selected = mixture.select_prompts([f"swe:{path}"], heldout,
                                   data.PromptOptions(num_prompts=100, max_context_tokens=100_000, max_per_trajectory=10))
    ids = {c.conv_id.removeprefix("swe-").rsplit("-m", 1)[0] for c in selected.conversations}
    assert eval_id not in ids and selected.stats["mixture"]["swe"]["dropped_heldout_id"] == 1
    assert "tmpl-0" in ids and {"clean-0", "clean-1", "clean-2"} <= ids
    # the leaky trajectory keeps only the cuts before its leaking message (index 3)
    leak_cuts = [int(c.conv_id.rsplit("-m", 1)[1]) for c in selected.conversations if "-leak-0-" in c.conv_id]
    assert leak_cuts == [2] and selected.stats["mixture"]["swe"]["dropped_heldout"] > 0
    for conv in selected.conversations:  # and nothing selected touches a sample's own text
        assert not any(heldout.overlaps(text, ignore_template=True) for _, text in conv.messages)


def test_boilerplate_common_to_training_trajectories_is_no_sample_text(tmp_path, heldout):
    """An evaluation sample's 13-gram that >= 3 training trajectories also hold (shell output headers, repository
    source) does not drop a context; one that only 1-2 trajectories hold (a leak) does."""
    swebench = get_task("swebench").load(LoadOptions())
    spans = [w[i:i + 13] for w in map(data._words, data.trajectory_texts(swebench[4])) for i in range(len(w) - 12)]
    own = [" ".join(g) for g in spans if data._gram_hash(g) not in heldout.template]
    common, rare = own[0], own[-1]
    assert data._gram_hash(common.split()) != data._gram_hash(rare.split())
    rows = agent_rows("t", 6, seed=21)
    for row in rows[:3]:  # the common span sits in three trajectories' observations
        row["messages"][3]["content"] += " " + common
    rows[3]["messages"][3]["content"] += " " + rare  # the rare one in one trajectory only
    path = write_jsonl(tmp_path / "swe.jsonl", rows)
    selected = mixture.select_prompts([f"swe:{path}"], heldout,
                                   data.PromptOptions(num_prompts=100, max_context_tokens=100_000, max_per_trajectory=10))
    cuts = {}
    for conv in selected.conversations:
        traj, cut = conv.conv_id.removeprefix("swe-").rsplit("-m", 1)
        cuts.setdefault(traj, []).append(int(cut))
    assert max(cuts["t-0"]) > 3 and max(cuts["t-2"]) > 3  # past the common span: kept
    assert cuts["t-3"] == [2]  # the rare span drops every context that holds it
    assert selected.stats["mixture"]["swe"]["common_heldout_ngrams_ignored"] >= 1


def test_the_bundled_training_sets_hold_out_every_evaluation_id(heldout):
    """The agent trajectories shipped for training hold no evaluation instance id."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "tasks/training"
    swe = {traj_id for traj_id, _ in mixture.load_trajectories(str(root / "mini-swe-agent_gemini-3-pro_train.jsonl.gz"))}
    tau = {traj_id for traj_id, _ in mixture.load_trajectories(str(root / "gpt-4o-airline.jsonl.gz"))}
    assert len(swe) == 414 and len(tau) == 200
    assert not (swe | tau) & heldout.sample_ids()


# ---- long contexts and the card ---------------------------------------------------------------------------------
def test_long_context_training_keeps_the_tail_and_records_the_data_hash(tmp_path):
    from evalsuite.testing import build_tiny_target
    from evalsuite.train.features import FeatureCache
    from evalsuite.train.generate import GenerationOptions, read_sequences
    from evalsuite.train.loop import LoopOptions
    from evalsuite.train.pipeline import TrainRequest, train

    target_dir = build_tiny_target(tmp_path / "target", "llama", layers=8)
    chat = write_jsonl(tmp_path / "chat.jsonl", chat_rows(12))
    agents = write_jsonl(tmp_path / "agents.jsonl.gz", agent_rows("a", 6, turns=3, tool_calls=True), compress=True)
    out = tmp_path / "drafter"
    request = TrainRequest(
        method="eagle3", target=str(target_dir), data=[f"{chat}:0.5", f"agents:{agents}:0.5"], out=out,
        work_dir=tmp_path / "work", steps=4,
        overrides={"batch_seqs": "2", "draft_vocab_size": "96", "intermediate_size": "64"},
        prompts=data.PromptOptions(num_prompts=12, max_context_tokens=1200, extra_math_prompts=0),
        generation=GenerationOptions(max_prompt_tokens=1200, max_new_tokens=8, batch_size=4, batch_tokens=2000),
        loop=LoopOptions(val_every=2, val_anchors=8, val_fraction=0.2, checkpoint_every=2), max_seq_len=64)
    report = train(request)
    sequences = {s.conv_id: s for s in read_sequences(tmp_path / "work" / "responses.jsonl")}
    assert max(len(s.prompt_ids) for s in sequences.values()) > 300  # long agent contexts were rendered
    cache = FeatureCache(tmp_path / "work" / "features")
    stored = np.diff(np.load(tmp_path / "work" / "features" / "offsets.npy"))
    assert cache.meta.max_seq_len == 64 and stored.max() <= 64 and len(stored) == len(sequences)
    card = (out / "MODEL_CARD.md").read_text()
    for path in (chat, agents):
        assert hashlib.sha256(path.read_bytes()).hexdigest() in card and path.name in card
    assert str(tmp_path) not in json.dumps(report["data_sources"])


def test_logged_labels_feed_the_agent_reply_and_label_it_with_the_targets_predictions(tmp_path):
    """--agent-labels logged: a trajectory context's response is its logged assistant reply, rendered through the
    target's template (nothing generated); the feature cache labels it with the target's own greedy predictions.
    Chat prompts are still regenerated."""
    from evalsuite.target.model import TargetModel
    from evalsuite.testing import build_tiny_target
    from evalsuite.train.features import FeatureCache
    from evalsuite.train.generate import GenerationOptions, read_sequences
    from evalsuite.train.loop import LoopOptions
    from evalsuite.train.pipeline import TrainRequest, train

    target_dir = build_tiny_target(tmp_path / "target", "llama", layers=8)
    chat = write_jsonl(tmp_path / "chat.jsonl", chat_rows(6))
    rows = agent_rows("a", 4, turns=3)
    agents = write_jsonl(tmp_path / "agents.jsonl", rows)
    request = TrainRequest(
        method="eagle3", target=str(target_dir), data=[f"{chat}:0.5", f"agents:{agents}:0.5"], out=tmp_path / "d",
        work_dir=tmp_path / "work", steps=2,
        overrides={"batch_seqs": "2", "draft_vocab_size": "96", "intermediate_size": "64"},
        prompts=data.PromptOptions(num_prompts=8, max_context_tokens=1200, extra_math_prompts=0),
        generation=GenerationOptions(max_prompt_tokens=1200, max_new_tokens=12, batch_size=4, agent_labels="logged"),
        loop=LoopOptions(val_every=2, val_anchors=8, val_fraction=0.2, checkpoint_every=2))
    report = train(request)
    target = TargetModel.load(str(target_dir))
    by_traj = {r["id"]: r["messages"] for r in rows}
    sequences = read_sequences(tmp_path / "work" / "responses.jsonl")
    logged = [s for s in sequences if s.labels == "logged"]
    assert logged and all(s.conv_id.startswith("agents-") for s in logged)
    assert all(s.labels == "regenerated" for s in sequences if not s.conv_id.startswith("agents-"))
    for seq in logged:
        traj, cut = seq.conv_id.removeprefix("agents-").rsplit("-m", 1)
        reply = by_traj[traj][int(cut)]["content"]
        expected = target.tokenizer(reply, add_special_tokens=False)["input_ids"][:12]
        assert seq.response_ids[:len(expected)] == expected[:len(seq.response_ids)]  # the logged text, capped
        assert len(seq.response_ids) <= 12
    assert report["data"]["logged_label_sequences"] == len(logged)
    cache = FeatureCache(tmp_path / "work" / "features")
    ids = [s.conv_id for s in sequences]
    i = ids.index(logged[0].conv_id)
    start, prompt_end, end = cache.span(i)
    full = logged[0].prompt_ids + logged[0].response_ids
    with torch.no_grad():
        preds = target.model(input_ids=torch.tensor([full])).logits[0].argmax(-1)
    # the label at each reply position is the target's own prediction over the logged text
    assert np.array_equal(np.asarray(cache.greedy[prompt_end - 1:end - 1]),
                          preds[len(logged[0].prompt_ids) - 1:len(full) - 1].numpy())
