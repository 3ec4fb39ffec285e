"""DSpark: released-format checkpoints load and decode losslessly; every slot predicts; Markov-corrected proposal
distributions; confidence truncation; own embed/lm_head with fallback; draft-cache cropping; mismatch errors."""

from __future__ import annotations

import json

import pytest
import torch

from evalsuite.errors import UserError
from evalsuite.methods.ar import AutoregressiveMethod
from evalsuite.methods.base import get_method
from evalsuite.methods.base import Sampling
from evalsuite.target.model import TargetModel
from tests.helpers import (
    PROMPT, assert_cache_matches_rebuild, decode, deepspec_checkpoint, scripted_commits,
)

build = get_method("dspark").factory


@pytest.fixture(scope="module")
def qwen3_target(tiny_qwen3_dir):
    return TargetModel.load(str(tiny_qwen3_dir))


def _started(drafter, target, n=len(PROMPT) - 1, seed=0):
    generator = torch.Generator().manual_seed(seed)
    drafter.start_turn(torch.tensor(PROMPT[: n + 1]),
                       torch.randn(n, len(drafter.feature_layers), target.hidden_size, generator=generator))
    return drafter


def test_checkpoint_is_lossless(tiny_target, tmp_path):
    reference = decode(tiny_target, AutoregressiveMethod(tiny_target.device), PROMPT, 40, k=1).output_ids
    drafter = build(tiny_target, {"drafter": str(deepspec_checkpoint(tmp_path / "ds", tiny_target))})
    info = drafter.describe()
    assert info["weights"] == "checkpoint" and info["markov_head"] == "vanilla" and info["confidence_head"]
    assert info["embed_tokens"] == "checkpoint" and info["lm_head"] == "checkpoint"
    assert drafter.embed is drafter.model.embed_tokens and drafter.embed is not tiny_target.embed_tokens
    result = decode(tiny_target, drafter, PROMPT, 40, k=7)
    assert result.output_ids == reference
    assert result.steps[0].num_drafted == 7
    with_threshold = build(tiny_target, {"drafter": str(tmp_path / "ds"), "confidence_threshold": 0.6})
    assert decode(tiny_target, with_threshold, PROMPT, 40, k=7).output_ids == reference


@pytest.mark.parametrize("kind", ["gated", "rnn"])
def test_markov_variants_are_lossless(qwen3_target, tmp_path, kind):
    reference = decode(qwen3_target, AutoregressiveMethod(qwen3_target.device), PROMPT, 30, k=1).output_ids
    path = deepspec_checkpoint(tmp_path / kind, qwen3_target, markov_head_type=kind, with_markov=kind == "gated")
    drafter = build(qwen3_target, {"drafter": str(path)})
    assert drafter.describe()["markov_head"] == kind
    assert decode(qwen3_target, drafter, PROMPT, 30, k=7).output_ids == reference


def test_every_slot_predicts_hand_worked(qwen3_target, tmp_path):
    """Anchor at position 5, block [anchor, MASK×6] at positions 5…11; slot j proposes the token at 5+j+1; the
    Markov bias of slot j comes from the token chosen at slot j-1 (the anchor for slot 0)."""
    drafter = build(qwen3_target, {"drafter": str(deepspec_checkpoint(tmp_path / "ds", qwen3_target))})
    calls, seen_previous = [], []

    def run_layers(block, context, positions, cache=None):
        calls.append((block.clone(), positions.tolist()))
        cache.advance(context.shape[0])
        out = torch.zeros_like(block)
        out[:, 0] = torch.arange(block.shape[0], dtype=block.dtype)
        return out

    vocab = qwen3_target.vocab_size
    drafter.model.run_layers = run_layers
    drafter.lm_head = lambda h: torch.nn.functional.one_hot(h[..., 0].long() + 100, vocab).float() * 10
    markov_step = drafter.markov.step

    def spy_step(previous, hidden, state):
        seen_previous.append(int(previous))
        return markov_step(previous, hidden, state)

    drafter.markov.step = spy_step
    with torch.no_grad():
        drafter.markov.markov_w2.weight.zero_()  # no Markov bias: the argmax is the lm_head's 100+j
    drafter.start_turn(torch.tensor([1, 40, 41, 42, 43, 77]), torch.randn(5, 3, qwen3_target.hidden_size))
    tokens = drafter.propose(7, Sampling(), None).tokens.tolist()
    block, positions = calls[0]
    assert positions == list(range(5, 12)) and drafter.cache.length == 5  # context 0…4 cached, block 5…11
    torch.testing.assert_close(block, drafter.model.embed_tokens(torch.tensor([77] + [3] * 6)))
    assert tokens == [100, 101, 102, 103, 104, 105, 106]  # slot j (position 5+j) → token at 5+j+1
    assert seen_previous == [77] + tokens[:-1]


def test_proposal_probs_are_the_markov_corrected_distribution(qwen3_target, tmp_path):
    drafter = build(qwen3_target, {"drafter": str(deepspec_checkpoint(tmp_path / "ds", qwen3_target))})
    hidden = _started(drafter, qwen3_target).block_outputs()
    _started(drafter, qwen3_target)  # the same turn again, now proposed
    temperature = 0.7
    proposal = drafter.propose(7, Sampling(temperature=temperature), torch.Generator().manual_seed(11))
    probs = proposal.probs
    assert probs.shape == (7, qwen3_target.vocab_size) and probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones(7))
    assert bool((probs >= 0).all())
    # recompute independently: lm_head(h_j) + markov_w2(markov_w1[x_{j-1}]), x_{-1} = anchor, softmax(/T)
    model = drafter.model
    previous = [PROMPT[-1]] + proposal.tokens.tolist()[:-1]
    logits = model.lm_head(hidden) + model.markov_head.markov_w2(model.markov_head.markov_w1(torch.tensor(previous)))
    torch.testing.assert_close(probs, torch.softmax(logits.float() / temperature, dim=-1), rtol=1e-5, atol=1e-6)
    plain = torch.softmax(model.lm_head(hidden).float() / temperature, dim=-1)
    assert not torch.allclose(probs, plain, atol=1e-3)  # the Markov correction is really applied
    # the tokens were drawn from exactly these rows
    generator = torch.Generator().manual_seed(11)
    redrawn = [int(torch.multinomial(row, 1, generator=generator)) for row in probs]
    assert redrawn == proposal.tokens.tolist()


def test_temperature_decode_runs(tiny_target, tmp_path):
    drafter = build(tiny_target, {"drafter": str(deepspec_checkpoint(tmp_path / "ds", tiny_target))})
    result = decode(tiny_target, drafter, PROMPT, 20, k=7, sampling=Sampling(temperature=1.0), seed=5)
    assert result.steps and result.steps[0].num_drafted == 7


@pytest.mark.parametrize("threshold, kept", [(0.0, 7), (0.5, 2), (0.7, 2), (0.75, 1), (0.95, 0)])
def test_confidence_threshold_truncates_at_first_low_slot(qwen3_target, tmp_path, threshold, kept):
    """Confidence logits [2, 1, -3, 5, 5, 5, 5] → sigmoid [.88, .73, .05, .99, …]: the block is cut before the
    first slot below the threshold; threshold 0 (the default) verifies all seven."""
    path = deepspec_checkpoint(tmp_path / "ds", qwen3_target)
    drafter = _started(build(qwen3_target, {"drafter": str(path), "confidence_threshold": threshold}), qwen3_target)
    drafter.confidence.forward = lambda features: torch.tensor([2.0, 1.0, -3.0, 5.0, 5.0, 5.0, 5.0])[
        : features.shape[0]]
    full = drafter.propose(7, Sampling(), None).tokens
    assert full.numel() == kept


def test_embed_and_head_fall_back_to_the_target(qwen3_target, tmp_path):
    path = deepspec_checkpoint(tmp_path / "ds", qwen3_target, own_embed_head=False)
    drafter = build(qwen3_target, {"drafter": str(path)})
    info = drafter.describe()
    assert info["embed_tokens"] == "target (not in checkpoint)" and info["lm_head"] == "target (not in checkpoint)"
    assert drafter.embed is qwen3_target.embed_tokens and drafter.lm_head is qwen3_target.lm_head
    reference = decode(qwen3_target, AutoregressiveMethod(qwen3_target.device), PROMPT, 20, k=1).output_ids
    assert decode(qwen3_target, drafter, PROMPT, 20, k=7).output_ids == reference


def test_draft_cache_equals_rebuild_from_scratch(qwen3_target, tmp_path):
    drafter = build(qwen3_target, {"drafter": str(deepspec_checkpoint(tmp_path / "ds", qwen3_target))})
    assert assert_cache_matches_rebuild(drafter, qwen3_target, PROMPT, 60, k=7) > 10
    scripted_commits(drafter, [1, 7, 2, 1, 5, 8], qwen3_target.hidden_size)


def test_random_init_default(tiny_target):
    drafter = build(tiny_target, {"drafter": "random"})
    info = drafter.describe()
    assert info["weights"] == "random-init" and info["block_size"] == 7 and info["markov_rank"] == 256
    assert drafter.lm_head is tiny_target.lm_head and tiny_target.num_layers - 1 not in drafter.feature_layers
    assert _started(drafter, tiny_target).propose(7, Sampling(), None).tokens.numel() == 7
    assert drafter.state_bytes().history > 0


@pytest.mark.parametrize("change, message", [
    (lambda c: c.pop("markov_head_type"), "markov_head_type is required"),
    (lambda c: c.update(markov_head_type="lstm"), "not one of"),
    (lambda c: c.update(target_layer_ids=[0, 1, 3]), "final target layer 3"),
    (lambda c: c.update(target_layer_ids=[2, 1]), "strictly increasing"),
    (lambda c: c.update(hidden_size=128), "hidden size 128"),
    (lambda c: c.update(mask_token_id=999), "mask token id 999"),
    (lambda c: c.pop("num_anchors"), "lacks 'num_anchors'"),
])
def test_mismatch_is_a_one_line_error(qwen3_target, tmp_path, change, message):
    path = deepspec_checkpoint(tmp_path / "ds", qwen3_target)
    config = json.loads((path / "config.json").read_text())
    change(config)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=message) as err:
        build(qwen3_target, {"drafter": str(path)})
    assert "\n" not in str(err.value)


def test_bad_threshold_is_refused():
    from evalsuite.config import RunConfig

    config = RunConfig(methods=["dspark"], task="gsm8k", method_options={"dspark": {"confidence_threshold": "1.5"}})
    with pytest.raises(UserError, match=r"dspark.confidence_threshold=1.5: must be in \[0, 1\]"):
        config.validate()
