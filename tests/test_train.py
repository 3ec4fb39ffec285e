"""`evalsuite train` end to end on a tiny random target: 20 steps lower the loss and write a checkpoint that
loads through the method factory and decodes losslessly; an interrupted run resumes to the same weights."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from evalsuite.errors import UserError
from evalsuite.methods.base import get_method
from evalsuite.methods.checkpoints import checkpoint_sha256
from evalsuite.target.model import TargetModel
from evalsuite.testing import build_tiny_target
from evalsuite.train.data import PromptOptions
from evalsuite.train.features import FeatureCache
from evalsuite.train.generate import GenerationOptions
from evalsuite.train.loop import LoopOptions, Trainer, sample_batch, split_sequences
from evalsuite.train.pipeline import TrainRequest, build_recipe, train
from evalsuite.train.recipes.common import parse_overrides, recipe_for
from tests.helpers import decode

SMALL = {"dlite": {"batch_seqs": "4", "anchors_per_seq": "6", "rank": "8", "intermediate_size": "64"},
         "dflash": {"batch_seqs": "4", "anchors_per_seq": "6", "intermediate_size": "64"},
         "dspark": {"batch_seqs": "4", "anchors_per_seq": "6", "intermediate_size": "64", "markov_rank": "4"},
         "eagle3": {"batch_seqs": "2", "draft_vocab_size": "96", "intermediate_size": "64"}}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    target_dir = build_tiny_target(root / "target", "llama", layers=8)  # deep enough for every layer rule
    words = "the cat dog sat ran on a mat log big small red blue and then".split()
    rng = random.Random(0)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(rng.choice(words) for _ in range(6)) + f" {i}"}) + "\n"
                               for i in range(24)))
    return root, target_dir, prompts


def request(setup, method: str, out, steps: int = 20) -> TrainRequest:
    root, target_dir, prompts = setup
    return TrainRequest(method=method, target=str(target_dir), data=[str(prompts)], out=out, work_dir=root / "work",
                        steps=steps, overrides=SMALL[method], prompts=PromptOptions(num_prompts=24),
                        generation=GenerationOptions(max_new_tokens=20, batch_size=24),
                        loop=LoopOptions(val_every=10, val_anchors=24, val_fraction=0.15, checkpoint_every=5))


def _recipe(setup, method: str):
    root, target_dir, _ = setup
    target = TargetModel.load(str(target_dir))
    cache = FeatureCache(root / "work" / "features")
    train_seqs, _ = split_sequences(cache, 0.15, 0)
    options = parse_overrides(recipe_for(method).options_type, SMALL[method], method)
    return target, cache, build_recipe(method, target, cache, options, train_seqs), train_seqs


@pytest.mark.parametrize("method", ["dlite", "dflash", "dspark", "eagle3"])
def test_twenty_steps_lower_the_loss_and_the_checkpoint_decodes_losslessly(setup, tmp_path, method):
    out = tmp_path / method
    report = train(request(setup, method, out))
    history = json.loads((out / "training_report.json").read_text())
    assert history["steps"] == 20 and (out / "MODEL_CARD.md").exists() and (out / "config.json").exists()
    assert checkpoint_sha256(out) in (out / "MODEL_CARD.md").read_text()

    # the loss of the final stage on a fixed batch: fresh weights vs trained weights
    target, cache, recipe, train_seqs = _recipe(setup, method)
    stage = recipe.stages(20)[-1]
    batch = sample_batch(cache, train_seqs, np.random.default_rng(7), 4, 6)
    with torch.no_grad():
        before = float(stage.loss(batch, 1.0)["loss"])
        state = torch.load(out / "train_state.pt", weights_only=True)["modules"]
        for key, module in recipe.modules().items():
            module.load_state_dict(state[key])
        after = float(stage.loss(batch, 1.0)["loss"])
    assert after < before, (before, after, report["final_losses"])

    # the exported checkpoint loads through the method factory and decodes exactly like the target alone
    drafter = get_method(method).factory(target, {"drafter": str(out)})
    assert drafter.checkpoint_hash == checkpoint_sha256(out)
    baseline = get_method("ar").factory(target, {})
    prompt = target.render([{"role": "user", "content": "the big cat sat on a red mat"}])
    spec = decode(target, drafter, prompt, 40, k=7)
    plain = decode(target, baseline, prompt, 40, k=7)
    assert spec.output_ids == plain.output_ids


def test_an_interrupted_run_resumes_to_the_same_weights(setup, tmp_path):
    method = "dlite"  # three stages: the interruption lands inside the second
    train(request(setup, method, tmp_path / "ref", steps=20))  # also builds the data if needed
    reference = torch.load(tmp_path / "ref" / "train_state.pt", weights_only=True)["modules"]

    class Interrupt(Exception):
        pass

    target, cache, recipe, _ = _recipe(setup, method)
    stages = recipe.stages(20)
    calls = {"n": 0}
    inner = stages[1].loss

    def failing(batch, fraction):
        calls["n"] += 1
        if calls["n"] == 4:  # the 4th step of stage 2 (its 3rd finished step was not checkpointed)
            raise Interrupt()
        return inner(batch, fraction)

    stages[1].loss = failing
    options = LoopOptions(val_every=10, val_anchors=24, val_fraction=0.15, checkpoint_every=2)
    with pytest.raises(Interrupt):
        Trainer(tmp_path / "resumed", cache, recipe.modules(), stages, options).run()
    saved = torch.load(tmp_path / "resumed" / "train_state.pt", weights_only=True)["history"]
    assert saved["stage"] == 1 and 0 < saved["step"] < stages[1].steps

    target, cache, fresh, _ = _recipe(setup, method)  # a new process: fresh modules, state from disk
    Trainer(tmp_path / "resumed", cache, fresh.modules(), fresh.stages(20), options).run()
    resumed = torch.load(tmp_path / "resumed" / "train_state.pt", weights_only=True)["modules"]
    for key in reference:
        for name, value in reference[key].items():
            torch.testing.assert_close(resumed[key][name], value, rtol=0, atol=0, msg=f"{key}.{name}")


def test_the_card_gives_cpu_time_beside_wall_time_and_a_resume_from_an_older_state_says_from_which_step(
        setup, tmp_path):
    from evalsuite.train.card import _cpu_clause

    method = "dflash"  # one stage
    target, cache, recipe, _ = _recipe(setup, method)
    options = LoopOptions(val_every=10, val_anchors=24, val_fraction=0.15, checkpoint_every=2)
    history = Trainer(tmp_path / "fresh", cache, recipe.modules(), recipe.stages(6), options).run()
    assert history.cpu_seconds > 0 and history.cpu_from_step == 0
    report = {"steps": 6, "training_seconds": history.seconds, "training_cpu_seconds": history.cpu_seconds,
              "training_cpu_from_step": history.cpu_from_step}
    assert "CPU-minutes over all threads;" in _cpu_clause(report) and "over steps" not in _cpu_clause(report)

    # a state written before CPU time was recorded (no such keys): it counts from the step resumed at
    out = tmp_path / "old"
    Trainer(out, cache, recipe.modules(), recipe.stages(6), options).run()
    state = torch.load(out / "train_state.pt", weights_only=True)
    del state["history"]["cpu_seconds"], state["history"]["cpu_from_step"]
    state["history"]["step"] = 4
    state["history"]["stage"] = 0
    torch.save(state, out / "train_state.pt")
    _, cache, fresh, _ = _recipe(setup, method)
    resumed = Trainer(out, cache, fresh.modules(), fresh.stages(6), options).run()
    assert resumed.cpu_from_step == 4 and resumed.cpu_seconds > 0
    report = {"steps": 6, "training_seconds": resumed.seconds, "training_cpu_seconds": resumed.cpu_seconds,
              "training_cpu_from_step": resumed.cpu_from_step}
    assert "over steps 5–6 (CPU time was not recorded before)" in _cpu_clause(report)
    assert _cpu_clause({"steps": 6, "training_seconds": 1.0}) == ""  # an older report: wall time only


def test_the_dlite_head_warm_start_learns_the_targets_greedy_tokens(setup, tmp_path):
    import dataclasses

    from evalsuite.train.recipes.common import fit_low_rank_head, lm_head_factors

    train(dataclasses.replace(request(setup, "dlite", tmp_path / "unused"), prepare_only=True))
    target, cache, _, train_seqs = _recipe(setup, "dlite")
    last = cache.layers[-1]
    A, B = lm_head_factors(target, 8)
    untouched = fit_low_rank_head(cache, train_seqs, last, A.clone(), B.clone(), steps=0)
    fitted = fit_low_rank_head(cache, train_seqs, last, A, B, steps=200, batch=64)
    assert fitted["last_loss"] < 0.8 * fitted["first_loss"]
    assert fitted["held_back_greedy_accuracy"] > untouched["held_back_greedy_accuracy"]
    assert not A.requires_grad and not B.requires_grad


def test_the_head_warm_start_is_fitted_once_per_set_of_inputs(setup, tmp_path, monkeypatch):
    """A resumed run reads the fitted head back from beside the feature cache instead of fitting it again; other
    inputs (here: another step count) fit anew."""
    import dataclasses

    from evalsuite.train.recipes import common

    train(dataclasses.replace(request(setup, "dlite", tmp_path / "unused"), prepare_only=True))
    target, cache, _, train_seqs = _recipe(setup, "dlite")
    last = cache.layers[-1]
    A0, B0 = common.lm_head_factors(target, 8)
    A1, B1 = A0.clone(), B0.clone()
    first = common.fit_low_rank_head(cache, train_seqs, last, A1, B1, steps=23, batch=32, seed=5)
    assert not torch.equal(A1, A0)

    def refit(*args, **kwargs):
        raise AssertionError("fitted again although the same inputs were fitted before")

    monkeypatch.setattr(common, "_fit_low_rank_head", refit)
    A2, B2 = A0.clone(), B0.clone()
    again = common.fit_low_rank_head(cache, train_seqs, last, A2, B2, steps=23, batch=32, seed=5)
    assert again == first
    assert torch.equal(A2, A1) and torch.equal(B2, B1)
    with pytest.raises(AssertionError, match="fitted again"):
        common.fit_low_rank_head(cache, train_seqs, last, A0.clone(), B0.clone(), steps=24, batch=32, seed=5)


@pytest.mark.parametrize("method", ["dlite", "eagle3", "dflash", "dspark"])
def test_init_warm_starts_from_a_released_checkpoint(setup, tmp_path, method):
    """`--init DIR` copies a released checkpoint of the same method into the trained module before step 1: the
    recipe's export then writes those exact tensors back; the card names the checkpoint's sha256."""
    from safetensors.torch import load_file

    overrides = {**SMALL[method], **({"single_stage": "true"} if method == "dlite" else {})}
    first = tmp_path / "first"
    req = request(setup, method, first, steps=4)
    req.overrides = overrides
    train(req)
    target, cache, _, train_seqs = _recipe(setup, method)
    recipe = build_recipe(method, target, cache, parse_overrides(recipe_for(method).options_type,
                                                                 {**overrides, "seed": "5"}, method), train_seqs)
    info = recipe.load_init(first)
    assert info["checkpoint_sha256"] == checkpoint_sha256(first) and info["from"] == "first"
    recipe.export(tmp_path / "again")
    saved, again = load_file(str(first / "model.safetensors")), load_file(str(tmp_path / "again" / "model.safetensors"))
    assert saved.keys() == again.keys()
    for key in saved:
        torch.testing.assert_close(again[key], saved[key], rtol=0, atol=0, msg=key)
    if method == "eagle3":  # the label mapping follows the loaded draft vocabulary
        vocab = recipe.model.d2t + torch.arange(recipe.model.d2t.numel())
        assert torch.equal(recipe.to_draft[vocab], torch.arange(vocab.numel()))
        assert int((recipe.to_draft >= 0).sum()) == vocab.numel()

    # through the pipeline: the card names the warm start
    second = tmp_path / "second"
    req = request(setup, method, second, steps=2)
    req.overrides, req.init = overrides, first
    report = train(req)
    assert report["init"]["checkpoint_sha256"] == checkpoint_sha256(first)
    assert report["init"]["prior"]["steps"] == 4 and report["init"]["prior"]["training_seconds"] > 0
    card = (second / "MODEL_CARD.md").read_text()
    assert checkpoint_sha256(first) in card and "itself trained 4 steps in" in card

    # a chain of warm starts: the card sums the training behind it
    third = tmp_path / "third"
    req = request(setup, method, third, steps=2)
    req.overrides, req.init = overrides, second
    report = train(req)
    assert report["init"]["prior"]["steps"] == 2 and report["init"]["prior"]["init"]["prior"]["steps"] == 4
    assert "itself trained 6 steps in" in (third / "MODEL_CARD.md").read_text()


def test_init_refuses_another_method_and_the_two_stage_dlite(setup, tmp_path):
    other = tmp_path / "eagle"
    req = request(setup, "eagle3", other, steps=2)
    train(req)
    _, _, recipe, _ = _recipe(setup, "dflash")
    with pytest.raises(UserError, match="a eagle3 checkpoint, not dflash"):
        recipe.load_init(other)
    _, _, dlite, _ = _recipe(setup, "dlite")  # SMALL dlite is two-stage
    with pytest.raises(UserError, match="single_stage=true"):
        dlite.load_init(other)


def test_dlite_with_a_draft_vocabulary_trains_exports_loads_and_warm_starts(setup, tmp_path):
    """`--set draft_vocab=N`: the head spans the N most frequent greedy tokens of the training replies
    (`draft_vocabulary`, as EAGLE-3's recipe chooses its own), the checkpoint carries draft_vocab_size and d2t,
    loads through the method factory and decodes losslessly; validation counts a label outside the vocabulary as
    a miss; a warm start from it keeps its vocabulary."""
    from safetensors.torch import load_file

    from evalsuite.train.recipes.common import draft_vocabulary

    overrides = {**SMALL["dlite"], "single_stage": "true", "draft_vocab": "40", "head_warm_start_steps": "30"}
    out = tmp_path / "dl"
    req = request(setup, "dlite", out, steps=6)
    req.overrides = overrides
    report = train(req)
    config = json.loads((out / "config.json").read_text())
    assert config["dlite_config"]["draft_vocab_size"] == 40
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["sequential_head.output_proj.weight"].shape == (40, 8)
    assert tensors["sequential_head.prev_token_embedding.weight"].shape == (41, 8)
    target, cache, _, train_seqs = _recipe(setup, "dlite")
    vocab = draft_vocabulary(cache, train_seqs, 40, target.vocab_size)
    assert torch.equal(tensors["sequential_head.d2t"] + torch.arange(40), vocab)
    assert report["recipe"]["draft_vocabulary"] == 40 and "tau_student" in report["validation"]

    drafter = get_method("dlite").factory(target, {"drafter": str(out)})
    assert torch.equal(drafter.model.sequential_head.target_ids(), vocab)
    prompt = cache.tokens[cache.span(train_seqs[0])[0]:cache.span(train_seqs[0])[1]].tolist()
    from evalsuite.methods.ar import AutoregressiveMethod

    reference = decode(target, AutoregressiveMethod(target.device), prompt, 24, k=1).output_ids
    assert decode(target, drafter, prompt, 24, k=7).output_ids == reference

    recipe = build_recipe("dlite", target, cache, parse_overrides(recipe_for("dlite").options_type,
                                                                  {**overrides, "seed": "3"}, "dlite"), train_seqs)
    head = recipe.student.sequential_head
    outside = next(i for i in range(target.vocab_size) if i not in set(vocab.tolist()))
    valid = recipe.train_sub.targets({"labels": torch.tensor([int(vocab[0]), outside]), "topk_ids": torch.zeros(2, 1,
                                      dtype=torch.long), "topk_probs": torch.ones(2, 1),
                                      "valid": torch.tensor([True, True])}, misses=True)
    assert valid["labels"].tolist() == [0, -1] and valid["valid"].tolist() == [True, True]
    recipe.load_init(out)
    assert torch.equal(head.target_ids(), vocab) and torch.equal(recipe.train_sub.ids, vocab)
    recipe.export(tmp_path / "again")
    again = load_file(str(tmp_path / "again" / "model.safetensors"))
    for key in tensors:
        torch.testing.assert_close(again[key], tensors[key], rtol=0, atol=0, msg=key)


def test_dlite_warm_starts_its_backbone_under_a_new_head(setup, tmp_path):
    """`--set init_head=false`: --init copies everything but the RNN head, which starts as it would without --init
    and may differ in shape (here: another rank and a draft vocabulary); the card says what was not copied."""
    from safetensors.torch import load_file

    first = tmp_path / "first"
    req = request(setup, "dlite", first, steps=3)
    req.overrides = {**SMALL["dlite"], "single_stage": "true"}
    train(req)
    overrides = {**SMALL["dlite"], "single_stage": "true", "rank": "12", "draft_vocab": "40", "init_head": "false",
                 "head_warm_start_steps": "0"}
    target, cache, _, train_seqs = _recipe(setup, "dlite")
    recipe = build_recipe("dlite", target, cache, parse_overrides(recipe_for("dlite").options_type, overrides,
                                                                  "dlite"), train_seqs)
    fresh_head = {k: v.clone() for k, v in recipe.student.sequential_head.state_dict().items()}
    assert recipe.load_init(first)["not_copied"] == ["sequential_head."]
    before = load_file(str(first / "model.safetensors"))
    state = recipe.student.state_dict()
    for key, value in before.items():
        if not key.startswith("sequential_head."):
            torch.testing.assert_close(state[key].to(value.dtype), value, rtol=0, atol=0, msg=key)
    for key, value in recipe.student.sequential_head.state_dict().items():
        assert torch.equal(value, fresh_head[key]), key
    assert recipe.student.sequential_head.output_proj.weight.shape == (40, 12)

    second = tmp_path / "second"
    req = request(setup, "dlite", second, steps=1)
    req.overrides, req.init = overrides, first
    assert train(req)["init"]["not_copied"] == ["sequential_head."]
    assert "not copied from it: sequential_head. (started afresh)" in (second / "MODEL_CARD.md").read_text()


def test_extra_cache_trains_on_two_work_dirs_and_a_resume_refuses_other_data(setup, tmp_path):
    root, target_dir, _ = setup
    words = "one two three four five six seven eight nine ten".split()
    more = root / "more.jsonl"
    more.write_text("".join(json.dumps({"prompt": " ".join(words[(i + j) % 10] for j in range(5)) + f" #{i}"}) + "\n"
                            for i in range(10)))
    extra = TrainRequest(method="dlite", target=str(target_dir), data=[str(more)], out=tmp_path / "x",
                         work_dir=root / "work-more", prepare_only=True, prompts=PromptOptions(num_prompts=10),
                         generation=GenerationOptions(max_new_tokens=20, batch_size=24))
    alone = train(extra)["data"]
    base = request(setup, "dlite", tmp_path / "single", steps=6)
    single = train(base)["data"]
    joined = request(setup, "dlite", tmp_path / "joined", steps=6)
    joined.extra_caches = [root / "work-more"]
    report = train(joined)
    assert report["data"]["sequences"] == single["sequences"] + alone["sequences"]
    assert report["data"]["reply_tokens"] == single["reply_tokens"] + alone["reply_tokens"]
    assert [e["work_dir"] for e in report["data"]["extra_caches"]] == [str(root / "work-more")]
    assert "more.jsonl" in " ".join(report["data_sources"])
    card = (tmp_path / "joined" / "MODEL_CARD.md").read_text()
    assert "joined (`--extra-cache`): work dir `work-more`: 10 prompts" in card
    # the joined run's training state may not resume on the work dir alone, nor a finished run's on other data
    (tmp_path / "single" / "MODEL_CARD.md").unlink()
    again = request(setup, "dlite", tmp_path / "single", steps=6)
    again.extra_caches = [root / "work-more"]
    with pytest.raises(UserError, match="begun on other training data .*data_sha256"):
        train(again)
    missing = request(setup, "dlite", tmp_path / "y", steps=6)
    missing.extra_caches = [root / "nowhere"]
    with pytest.raises(UserError, match="--extra-cache .*nowhere: no prompts.jsonl there"):
        train(missing)
