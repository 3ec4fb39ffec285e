"""DFlash: z-lab b16 and DeepSpec block7 checkpoints load and decode losslessly; block layout; draft-cache
cropping; drafter/target mismatch errors."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from evalsuite.errors import UserError
from evalsuite.methods.ar import AutoregressiveMethod
from evalsuite.methods.base import get_method
from evalsuite.methods.base import Sampling
from evalsuite.methods.dflash import DeepSpecDFlashMethod, ZLabDFlashMethod
from tests.helpers import (
    PROMPT, assert_cache_matches_rebuild, decode, deepspec_checkpoint, scripted_commits, zlab_checkpoint,
)

build = get_method("dflash").factory


@pytest.fixture(scope="module")
def ar_outputs():
    """AR reference output per target, computed once."""
    return {}


def reference(target, ar_outputs, max_new=40):
    key = (target.config.model_type, max_new)
    if key not in ar_outputs:
        ar_outputs[key] = decode(target, AutoregressiveMethod(target.device), PROMPT, max_new, k=1).output_ids
    return ar_outputs[key]


def test_zlab_checkpoint_is_lossless(tiny_target, tmp_path, ar_outputs):
    path = zlab_checkpoint(tmp_path / "zlab", tiny_target)
    drafter = build(tiny_target, {"drafter": str(path)})
    assert isinstance(drafter, ZLabDFlashMethod) and drafter.feature_layers == (0, 1, 2)
    info = drafter.describe()
    assert info["weights"] == "checkpoint" and info["layout"] == "zlab" and len(info["checkpoint_sha256"]) == 64
    for k in (3, 15):
        result = decode(tiny_target, drafter, PROMPT, 40, k=k)
        assert result.output_ids == reference(tiny_target, ar_outputs)
        assert max(s.num_drafted for s in result.steps) == k


def test_block7_checkpoint_is_lossless(tiny_target, tmp_path, ar_outputs):
    path = deepspec_checkpoint(tmp_path / "block7", tiny_target, markov_rank=0, confidence=False)
    drafter = build(tiny_target, {"drafter": str(path)})
    assert isinstance(drafter, DeepSpecDFlashMethod) and drafter.describe()["layout"] == "block7"
    assert drafter.markov is None and drafter.confidence is None
    result = decode(tiny_target, drafter, PROMPT, 40, k=7)
    assert result.output_ids == reference(tiny_target, ar_outputs)
    assert max(s.num_drafted for s in result.steps) == 7  # block 7: seven proposals, the anchor slot included


def test_block7_is_refused_as_dspark(tiny_target, tmp_path):
    path = deepspec_checkpoint(tmp_path / "block7", tiny_target, markov_rank=0, confidence=False)
    with pytest.raises(UserError, match="is a dflash checkpoint"):
        get_method("dspark").factory(tiny_target, {"drafter": str(path)})


def _fake_backbone(drafter, calls):
    """Replace the layers: slot j outputs a row whose first entry is j, and a head that turns it into token 100+j."""
    vocab = drafter.lm_head.weight.shape[0] if hasattr(drafter.lm_head, "weight") else 260

    def run_layers(block, context, positions, cache=None):
        calls.append({"block": block.clone(), "context_rows": context.shape[0], "positions": positions.tolist()})
        if cache is not None:
            cache.advance(context.shape[0])
        out = torch.zeros_like(block)
        out[:, 0] = torch.arange(block.shape[0], dtype=block.dtype)
        return out

    drafter.model.run_layers = run_layers
    drafter.lm_head = lambda h: F.one_hot(h[..., 0].long() + 100, vocab).float()


def test_block_layouts_hand_worked(tiny_qwen3_dir, tmp_path):
    """Context of n=5 tokens, anchor at position 5. z-lab b16: block = [anchor, MASK×15] at positions 5…20, the
    mask at position 5+k proposes the token at 5+k (slot k, k ≥ 1). DeepSpec block7: block at 5…11, slot j
    proposes the token at 5+j+1 (slot 0, the anchor, predicts too)."""
    from evalsuite.target.model import TargetModel

    target = TargetModel.load(str(tiny_qwen3_dir))
    ids = torch.tensor([1, 40, 41, 42, 43, 77])  # anchor 77 at position 5
    features = torch.randn(5, 3, target.hidden_size)
    embed = target.embed_tokens

    zlab = build(target, {"drafter": str(zlab_checkpoint(tmp_path / "z", target, mask_token_id=3))})
    calls, prefill = [], []
    _fake_backbone(zlab, calls)
    extend = zlab.model.extend_cache
    zlab.model.extend_cache = lambda rows, positions, cache: prefill.append(positions.tolist()) or \
        extend(rows, positions, cache)
    zlab.start_turn(ids, features)
    assert prefill == [[0, 1, 2, 3, 4]] and zlab.cache.length == 5  # the draft prefill: context at 0…4
    tokens = zlab.propose(4, Sampling(), None).tokens.tolist()
    assert tokens == [101, 102, 103, 104]  # slots 1..4 → positions 6..9, i.e. drafts 1..4 after the anchor
    assert calls[0]["positions"] == list(range(5, 21)) and calls[0]["context_rows"] == 0
    torch.testing.assert_close(calls[0]["block"], embed(torch.tensor([77] + [3] * 15)))
    # after accepting 2 drafts + bonus: 3 new context rows at positions 5..7, block at 8..23
    zlab.commit(torch.tensor([101, 102, 9]), torch.randn(3, 3, target.hidden_size))
    zlab.propose(15, Sampling(), None)
    assert calls[1]["positions"] == list(range(5, 8)) + list(range(8, 24)) and calls[1]["context_rows"] == 3
    assert calls[1]["block"][0].equal(embed(torch.tensor(9)))

    block7 = build(target, {"drafter": str(deepspec_checkpoint(tmp_path / "b7", target, markov_rank=0,
                                                                 confidence=False))})
    calls = []
    _fake_backbone(block7, calls)
    block7.start_turn(ids, features)
    assert block7.propose(7, Sampling(), None).tokens.tolist() == [100, 101, 102, 103, 104, 105, 106]
    assert calls[0]["positions"] == list(range(5, 12)) and block7.cache.length == 5
    torch.testing.assert_close(calls[0]["block"], block7.model.embed_tokens(torch.tensor([77] + [3] * 6)))


@pytest.mark.parametrize("layout", ["zlab", "block7"])
def test_draft_cache_equals_rebuild_from_scratch(tiny_qwen3_dir, tmp_path, layout):
    """After every verify step (rejections included) the cache holds exactly the context: a long turn's block
    outputs equal those of a drafter whose cache is rebuilt from the whole context at that step."""
    from evalsuite.target.model import TargetModel

    target = TargetModel.load(str(tiny_qwen3_dir))
    path = zlab_checkpoint(tmp_path / "z", target) if layout == "zlab" else \
        deepspec_checkpoint(tmp_path / "b7", target, markov_rank=0, confidence=False)
    drafter = build(target, {"drafter": str(path)})
    assert assert_cache_matches_rebuild(drafter, target, PROMPT, 60, k=7) > 10
    scripted_commits(drafter, [1, 8, 3, 1, 16, 2], target.hidden_size)  # acceptances of every size


def test_zlab_draft_is_greedy_at_temperature(tiny_target, tmp_path):
    """z-lab drafts argmax even when the target samples: the proposal is one-hot (probs None)."""
    drafter = build(tiny_target, {"drafter": str(zlab_checkpoint(tmp_path / "z", tiny_target))})
    result = decode(tiny_target, drafter, PROMPT, 24, k=5, sampling=Sampling(temperature=1.0), seed=3)
    assert result.steps[0].num_drafted == 5
    drafter.start_turn(torch.tensor(PROMPT), torch.randn(len(PROMPT) - 1, 3, tiny_target.hidden_size))
    assert drafter.propose(5, Sampling(temperature=1.0), torch.Generator().manual_seed(0)).probs is None


def test_random_init_default(tiny_target):
    drafter = build(tiny_target, {"drafter": "random"})
    info = drafter.describe()
    assert info["weights"] == "random-init" and info["checkpoint"] is None and info["block_size"] == 16
    drafter.start_turn(torch.tensor(PROMPT), torch.randn(len(PROMPT) - 1, len(drafter.feature_layers),
                                                         tiny_target.hidden_size))
    assert drafter.propose(15, Sampling(), None).tokens.numel() == 15
    state = drafter.state_bytes()
    assert state.history > 0 and state.working > 0
    assert build(tiny_target, {"drafter": "random", "layout": "block7"}).describe()["layout"] == "block7"
    with pytest.raises(UserError, match="layout"):
        build(tiny_target, {"drafter": "random", "layout": "b16"})


def test_history_bytes_grow_with_context(tiny_qwen3_dir):
    from evalsuite.target.model import TargetModel

    target = TargetModel.load(str(tiny_qwen3_dir))
    drafter = build(target, {"drafter": "random"})
    sizes = []
    for n in (50, 100):
        drafter.start_turn(torch.randint(4, 200, (n + 1,)), torch.randn(n, len(drafter.feature_layers), 64))
        drafter.propose(15, Sampling(), None)
        sizes.append(drafter.state_bytes().history)
    per_token = 2 * len(drafter.model.layers) * target.config.num_key_value_heads * 16 * 4  # K+V, fp32
    assert sizes == [50 * per_token, 100 * per_token]


@pytest.mark.parametrize("change, message", [
    (lambda c: c.update(hidden_size=32), "hidden size 32"),
    (lambda c: c.update(vocab_size=300), "vocabulary 300"),
    (lambda c: c.update(num_target_layers=36), "36-layer target"),
    (lambda c: c["dflash_config"].update(target_layer_ids=[1, 9, 17]), r"layers \[9, 17\]"),
    (lambda c: c["dflash_config"].update(mask_token_id=151669), "mask token id 151669"),
    (lambda c: c["dflash_config"].pop("mask_token_id"), "lacks 'mask_token_id'"),
])
def test_mismatch_is_a_one_line_error(tiny_qwen3_dir, tmp_path, change, message):
    from evalsuite.target.model import TargetModel

    target = TargetModel.load(str(tiny_qwen3_dir))
    path = zlab_checkpoint(tmp_path / "z", target)
    config = json.loads((path / "config.json").read_text())
    change(config)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=message) as err:
        build(target, {"drafter": str(path)})
    assert "\n" not in str(err.value)


def test_block7_final_target_layer_is_refused(tiny_qwen3_dir, tmp_path):
    from evalsuite.target.model import TargetModel

    target = TargetModel.load(str(tiny_qwen3_dir))
    path = deepspec_checkpoint(tmp_path / "b7", target, layer_ids=(0, 1, 3), markov_rank=0, confidence=False)
    with pytest.raises(UserError, match="final target layer 3"):
        build(target, {"drafter": str(path)})


def test_block7_samples_at_temperature_from_its_lm_head(tiny_qwen3_dir, tmp_path):
    """DeepSpec block7 (no Markov head) draws every slot from softmax(lm_head(h_j) / T) and reports exactly that."""
    from evalsuite.target.model import TargetModel

    target = TargetModel.load(str(tiny_qwen3_dir))
    path = deepspec_checkpoint(tmp_path / "b7", target, markov_rank=0, confidence=False)
    drafter = build(target, {"drafter": str(path)})
    features = torch.randn(len(PROMPT) - 1, 3, target.hidden_size)
    drafter.start_turn(torch.tensor(PROMPT), features)
    hidden = drafter.block_outputs()
    drafter.start_turn(torch.tensor(PROMPT), features)
    proposal = drafter.propose(7, Sampling(temperature=0.9), torch.Generator().manual_seed(4))
    expected = torch.softmax(drafter.model.lm_head(hidden).float() / 0.9, dim=-1)
    torch.testing.assert_close(proposal.probs, expected, rtol=1e-5, atol=1e-6)
    generator = torch.Generator().manual_seed(4)
    assert [int(torch.multinomial(row, 1, generator=generator)) for row in proposal.probs] == proposal.tokens.tolist()
