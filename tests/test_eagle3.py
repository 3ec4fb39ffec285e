"""EAGLE-3: both released formats from synthetic checkpoints, T=0 losslessness, the draft-cache layout, cropping
after rejections, fit errors, and the T>0 proposal distribution."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from evalsuite.engines.hf import PrefixCache
from evalsuite.errors import UserError
from evalsuite.methods.ar import AutoregressiveMethod
from evalsuite.methods.base import Sampling
from evalsuite.methods.draft_layers import evenly_spaced_zlab
from evalsuite.methods.eagle3 import DEEPSPEC, SPECFORGE, DraftKVCache, Eagle3Method, build
from evalsuite.target.model import TargetModel
from evalsuite.testing import build_tiny_target
from tests import helpers

LAYERS = 8  # deep enough for distinct default layer ids: SpecForge [1, 3, 4], DeepSpec spread [1, 2, 3, 4, 5]
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 64, 4, 2, 16, 96
DRAFT_VOCAB = 96


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> dict[str, TargetModel]:
    root = tmp_path_factory.mktemp("eagle3-targets")
    return {arch: TargetModel.load(str(build_tiny_target(root / arch, arch, layers=LAYERS)))
            for arch in ("llama", "qwen3")}


def _randn(generator, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=generator) * 0.1


def _layer_tensors(prefix: str, generator, qk_norm: bool, hidden: int = HIDDEN,
                   intermediate: int = INTERMEDIATE) -> dict[str, torch.Tensor]:
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    tensors = {
        f"{prefix}.self_attn.q_proj.weight": _randn(generator, q, 2 * hidden),
        f"{prefix}.self_attn.k_proj.weight": _randn(generator, kv, 2 * hidden),
        f"{prefix}.self_attn.v_proj.weight": _randn(generator, kv, 2 * hidden),
        f"{prefix}.self_attn.o_proj.weight": _randn(generator, hidden, q),
        f"{prefix}.mlp.gate_proj.weight": _randn(generator, intermediate, hidden),
        f"{prefix}.mlp.up_proj.weight": _randn(generator, intermediate, hidden),
        f"{prefix}.mlp.down_proj.weight": _randn(generator, hidden, intermediate),
        f"{prefix}.hidden_norm.weight": 1 + _randn(generator, hidden),
        f"{prefix}.input_layernorm.weight": 1 + _randn(generator, hidden),
        f"{prefix}.post_attention_layernorm.weight": 1 + _randn(generator, hidden),
    }
    if qk_norm:
        tensors[f"{prefix}.self_attn.q_norm.weight"] = 1 + _randn(generator, HEAD_DIM)
        tensors[f"{prefix}.self_attn.k_norm.weight"] = 1 + _randn(generator, HEAD_DIM)
    return tensors


def write_specforge(directory, vocab: int = 260, hidden: int = HIDDEN, draft_vocab: int = DRAFT_VOCAB,
                    with_embedding: bool = False, seed: int = 1, head_from: TargetModel | None = None,
                    fc_norm: bool = False):
    """Config keys of SpecForge `configs/qwen3-8b-eagle3.json`, scaled down; keys of `LlamaForCausalLMEagle3`.
    `head_from`: take the lm_head rows of the mapped ids from this target (a drafter that agrees sometimes)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": [SPECFORGE], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
        "eos_token_id": 2, "head_dim": HEAD_DIM, "hidden_act": "silu", "hidden_size": hidden,
        "initializer_range": 0.02, "intermediate_size": INTERMEDIATE, "max_position_embeddings": 2048,
        "max_window_layers": LAYERS, "model_type": "llama", "num_attention_heads": HEADS, "num_hidden_layers": 1,
        "num_key_value_heads": KV_HEADS, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": vocab,
        "draft_vocab_size": draft_vocab,
    }
    g = torch.Generator().manual_seed(seed)
    # A draft vocabulary of every other id from 4: target id = draft id + d2t[draft id].
    draft_to_target = torch.arange(draft_vocab) * 2 + 4
    head = _randn(g, draft_vocab, hidden) if head_from is None else \
        head_from.lm_head.weight.detach()[draft_to_target].clone()
    tensors = {"fc.weight": _randn(g, hidden, 3 * hidden), "norm.weight": 1 + _randn(g, hidden),
               "lm_head.weight": head, **_layer_tensors("midlayer", g, qk_norm=False, hidden=hidden)}
    tensors["d2t"] = draft_to_target - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[draft_to_target] = True
    tensors["t2d"] = t2d
    if with_embedding:
        tensors["embed_tokens.weight"] = _randn(g, vocab, hidden)
    if fc_norm:  # SpecForge's optional per-layer RMSNorm before fc
        config["fc_norm"] = True
        tensors.update({f"fc_norm.{i}.weight": 1 + _randn(g, hidden) for i in range(3)})
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    return directory


def write_deepspec(directory, target: TargetModel, layer_ids=(1, 2, 3, 4, 5), seed: int = 2,
                   num_target_layers: int | None = None):
    """DeepSpec `build_draft_config`: a deep copy of the target config plus the EAGLE-3 keys; keys of
    `Qwen3Eagle3Model` (own embed_tokens and lm_head copies)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(json.loads((target_dir(target) / "config.json").read_text()))
    config.update(architectures=[DEEPSPEC], num_target_layers=num_target_layers or target.num_layers,
                  num_hidden_layers=1, layer_types=["full_attention"], target_model_name_or_path="tiny",
                  target_layer_ids=list(layer_ids), ttt_length=7, step_loss_decay=0.8, draft_num_hidden_layers=1,
                  tie_word_embeddings=False)
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    g = torch.Generator().manual_seed(seed)
    tensors = {"embed_tokens.weight": target.embed_tokens.weight.detach().clone(),
               "lm_head.weight": target.lm_head.weight.detach().clone(),
               "fc.weight": _randn(g, hidden, len(layer_ids) * hidden), "norm.weight": 1 + _randn(g, hidden),
               **_layer_tensors("layers.0", g, qk_norm=True, hidden=hidden,
                                intermediate=config["intermediate_size"])}
    assert tensors["lm_head.weight"].shape == (vocab, hidden)
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    return directory


def target_dir(target: TargetModel) -> Path:
    return Path(target.model_dir)


def decode(target, drafter, prompt, max_new=48, k=5, sampling=Sampling(), seed=0):
    return helpers.decode(target, drafter, prompt, max_new, k, sampling, seed)


PROMPT = [1, 40, 41, 42, 43, 40, 41, 42, 100, 7, 7, 7, 9, 100, 7] + list(range(50, 80))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, targets):
    root = tmp_path_factory.mktemp("eagle3-ckpts")
    return {"specforge": write_specforge(root / "specforge", head_from=targets["qwen3"]),
            "specforge-embed": write_specforge(root / "specforge-embed", with_embedding=True),
            "specforge-fc-norm": write_specforge(root / "specforge-fc-norm", fc_norm=True, head_from=targets["llama"]),
            "deepspec": write_deepspec(root / "deepspec", targets["qwen3"])}


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("fmt", ["specforge", "specforge-fc-norm", "deepspec"])
def test_released_formats_load_and_are_lossless_at_t0(targets, checkpoints, arch, fmt):
    target = targets[arch]
    drafter = build(target, {"drafter": str(checkpoints[fmt])})
    info = drafter.describe()
    assert info["weights"] == "checkpoint" and info["checkpoint_sha256"]
    if fmt.startswith("specforge"):
        assert (drafter.model.fc_norm is not None) == fmt.endswith("fc-norm")
        assert drafter.feature_layers == (1, LAYERS // 2 - 1, LAYERS - 4)
        assert info["draft_vocab_size"] == DRAFT_VOCAB and info["embed_tokens"] == "target"
        assert drafter.model.embed_tokens.weight is target.embed_tokens.weight
        assert drafter.model.d2t[3] == 3 + 4  # draft id 3 → target id 10
    else:
        assert drafter.feature_layers == (1, 2, 3, 4, 5) and info["embed_tokens"] == "checkpoint"
        assert drafter.model.layers[0].self_attn.q_norm is not None
    reference = decode(target, AutoregressiveMethod(target.device), PROMPT)
    for k in (1, 4, 7):
        assert decode(target, drafter, PROMPT, k=k).output_ids == reference.output_ids, k


def test_specforge_checkpoint_embedding_is_used_when_present(targets, checkpoints):
    drafter = build(targets["llama"], {"drafter": str(checkpoints["specforge-embed"])})
    assert drafter.describe()["embed_tokens"] == "checkpoint"
    assert drafter.model.embed_tokens.weight is not targets["llama"].embed_tokens.weight
    saved = load_file(str(checkpoints["specforge-embed"] / "model.safetensors"))
    assert torch.equal(drafter.model.embed_tokens.weight, saved["embed_tokens.weight"])
    assert torch.equal(drafter.model.midlayer.self_attn.q_proj.weight, saved["midlayer.self_attn.q_proj.weight"])


class Recorder:
    """Wraps the draft model's forward: records (positions, tokens, hidden input) of every cache extension."""

    def __init__(self, drafter: Eagle3Method):
        self.calls = []
        self.outputs = []
        inner = drafter.model.forward

        def forward(hidden, tokens, positions, cache, all_outputs=False):
            self.calls.append((positions.tolist(), tokens.tolist(), hidden.clone()))
            out = inner(hidden, tokens, positions, cache, all_outputs)
            self.outputs.append(out.clone())
            return out

        drafter.model.forward = forward


def test_draft_cache_layout_on_a_hand_worked_example(targets, checkpoints):
    """Context ids [10..15]: 15 is the anchor at position 5, target features f0..f4 exist.
    - start_turn: entries (f_i, token i+1) at positions 0..4.
    - propose(3): draft 1 comes from the output at position 4 and is the token for position 6; the entry
      (that output, draft 1) goes to position 5 and yields draft 2 (position 7); (its output, draft 2) at
      position 6 yields draft 3 (position 8). No entry is written for draft 3.
    - commit([d1, bonus], [f5, f6]): the cache is cropped back to 5 entries, then (f5, d1) at 5, (f6, bonus) at 6.
    """
    target = targets["qwen3"]
    drafter = build(target, {"drafter": str(checkpoints["specforge"])})
    rec = Recorder(drafter)
    ids = torch.tensor([10, 11, 12, 13, 14, 15])
    features = torch.randn(7, 3, HIDDEN, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fused = drafter.model.fuse(features)

    drafter.start_turn(ids, features[:5])
    assert rec.calls[0][:2] == ([0, 1, 2, 3, 4], [11, 12, 13, 14, 15])
    torch.testing.assert_close(rec.calls[0][2], fused[:5])
    assert drafter.cache.length == 5

    proposal = drafter.propose(3, Sampling(), None)
    d1, d2, d3 = proposal.tokens.tolist()
    first_logits = drafter.model.logits(rec.outputs[0])[0]
    assert d1 == int(drafter.model.draft_to_target()[first_logits.argmax()])
    assert [c[:2] for c in rec.calls[1:]] == [([5], [d1]), ([6], [d2])]
    assert torch.equal(rec.calls[1][2], rec.outputs[0]) and torch.equal(rec.calls[2][2], rec.outputs[1])
    assert d3 == int(drafter.model.draft_to_target()[drafter.model.logits(rec.outputs[2])[0].argmax()])
    assert drafter.cache.length == 7  # the proposal's own entries, dropped on commit

    bonus = 20
    drafter.commit(torch.tensor([d1, bonus]), features[5:7])
    assert rec.calls[3][:2] == ([5, 6], [d1, bonus])
    torch.testing.assert_close(rec.calls[3][2], fused[5:7])
    assert drafter.cache.length == 7

    drafter.propose(2, Sampling(), None)
    assert rec.calls[4][0] == [7]  # the next proposal continues after the new anchor (position 7)


class RebuildingMethod(Eagle3Method):
    """Rebuilds its draft cache from the whole context at every commit (no cropping ever happens)."""

    def start_turn(self, ids, features):
        self.all_ids, self.all_features = ids.clone(), features.clone()
        super().start_turn(ids, features)

    def commit(self, new_ids, new_features):
        self.all_ids = torch.cat([self.all_ids, new_ids])
        self.all_features = torch.cat([self.all_features, new_features])
        super().start_turn(self.all_ids, self.all_features)


def _log_proposals(drafter):
    log = []
    inner = drafter.propose

    def propose(k, sampling, generator):
        proposal = inner(k, sampling, generator)
        log.append((proposal.tokens.clone(), None if proposal.probs is None else proposal.probs.clone(),
                    drafter.hidden.clone()))
        return proposal

    drafter.propose = propose
    return log


@pytest.mark.parametrize("fmt", ["specforge", "deepspec"])
def test_cropped_cache_equals_cache_rebuilt_every_step(targets, checkpoints, fmt):
    """At T=1 drafts get accepted, so commits of several tokens and crops after rejections both happen."""
    target = targets["qwen3"]
    incremental = build(target, {"drafter": str(checkpoints[fmt])})
    rebuilt = build(target, {"drafter": str(checkpoints[fmt])})
    rebuilt.__class__ = RebuildingMethod
    logs = [_log_proposals(incremental), _log_proposals(rebuilt)]
    sampling = Sampling(temperature=1.0)
    results = [decode(target, d, PROMPT, max_new=80, k=4, sampling=sampling, seed=3) for d in (incremental, rebuilt)]
    assert results[0].output_ids == results[1].output_ids
    assert max(s.num_accepted for s in results[0].steps) >= 2, "no multi-token commit was exercised"
    assert any(s.num_accepted < s.num_drafted for s in results[0].steps), "no rejection was exercised"
    assert len(logs[0]) == len(logs[1])
    for (tok_a, probs_a, hid_a), (tok_b, probs_b, hid_b) in zip(*logs):
        assert torch.equal(tok_a, tok_b)
        torch.testing.assert_close(probs_a, probs_b, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(hid_a, hid_b, rtol=1e-4, atol=1e-5)
    # the incremental cache holds exactly one entry per target feature
    assert incremental.cache.length == len(PROMPT) + len(results[0].output_ids) - 1


def test_all_outputs_mode_matches_one_entry_at_a_time(targets, checkpoints):
    """A prefill over many entries gives the same newest output as feeding them one by one (causal mask)."""
    drafter = build(targets["qwen3"], {"drafter": str(checkpoints["deepspec"])})
    model = drafter.model
    n = 9
    g = torch.Generator().manual_seed(5)
    fused = model.fuse(torch.randn(n, 5, HIDDEN, generator=g))
    tokens = torch.randint(4, 260, (n,), generator=g)
    with torch.no_grad():
        whole = model(fused, tokens, torch.arange(n), DraftKVCache(KV_HEADS, HEAD_DIM, torch.float32, "cpu", 4),
                      all_outputs=True)
        cache = DraftKVCache(KV_HEADS, HEAD_DIM, torch.float32, "cpu", 4)
        stepwise = torch.cat([model(fused[i:i + 1], tokens[i:i + 1], torch.tensor([i]), cache) for i in range(n)])
    torch.testing.assert_close(whole, stepwise, rtol=1e-5, atol=1e-5)


def test_sampled_proposals_carry_their_full_vocabulary_distribution(targets, checkpoints):
    target = targets["llama"]
    drafter = build(target, {"drafter": str(checkpoints["specforge"])})
    ids = torch.tensor(PROMPT)
    prefix = PrefixCache(target, drafter.feature_layers)
    prefix.prefill(PROMPT)
    drafter.start_turn(torch.cat([ids, ids.new_tensor([7])]), prefix.features)
    proposal = drafter.propose(6, Sampling(temperature=0.7), torch.Generator().manual_seed(0))
    probs = proposal.probs
    assert probs.shape == (proposal.tokens.numel(), target.vocab_size) and probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[0]))
    assert (probs >= 0).all()
    in_draft_vocab = torch.zeros(target.vocab_size, dtype=torch.bool)
    in_draft_vocab[drafter.model.draft_to_target()] = True
    assert (probs[:, ~in_draft_vocab] == 0).all()  # only target ids the draft vocabulary maps to
    assert (probs[torch.arange(probs.shape[0]), proposal.tokens] > 0).all()
    # the first row is softmax(logits / T) of the draft head, placed at the mapped target ids
    drafter.start_turn(torch.cat([ids, ids.new_tensor([7])]), prefix.features)
    expected = torch.softmax(drafter.model.logits(drafter.hidden)[0] / 0.7, -1)
    torch.testing.assert_close(probs[0, drafter.model.draft_to_target()], expected)
    assert drafter.state_bytes().working >= probs.numel() * 4


def test_drafter_that_does_not_fit_the_target_is_refused(tmp_path, targets):
    target = targets["qwen3"]
    cases = {
        "hidden size": write_specforge(tmp_path / "wide", hidden=32),
        "vocabulary": write_specforge(tmp_path / "vocab", vocab=300),
        "10-layer target": write_deepspec(tmp_path / "depth", target, num_target_layers=10),
        "reads target layers [9]": write_deepspec(tmp_path / "layers", target, layer_ids=(1, 2, 3, 4, 9)),
        "last layer": write_deepspec(tmp_path / "last", target, layer_ids=(1, 2, 3, 4, LAYERS - 1)),
    }
    for words, path in cases.items():
        with pytest.raises(UserError) as err:
            build(target, {"drafter": str(path)})
        message = str(err.value)
        assert words in message and "\n" not in message, message


def test_checkpoint_with_missing_weights_is_refused(tmp_path, targets):
    path = write_deepspec(tmp_path / "partial", targets["qwen3"])
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["layers.0.self_attn.k_norm.weight"]
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(UserError, match="missing layers.0.self_attn.k_norm.weight"):
        build(targets["qwen3"], {"drafter": str(path)})


def test_random_init_default_follows_the_target(targets):
    target = targets["llama"]
    drafter = build(target, {"drafter": "random"})
    info = drafter.describe()
    assert info["weights"] == "random-init" and info["format"] == DEEPSPEC
    assert drafter.feature_layers == (1, 2, 3, 4, 5)
    assert info["hidden_size"] == target.hidden_size and info["intermediate_size"] == target.config.intermediate_size
    assert evenly_spaced_zlab(36, 5) == [1, 9, 17, 25, 33] and evenly_spaced_zlab(40, 5) == [1, 10, 19, 28, 37]
    small = build(target, {"drafter": "random", "format": "specforge", "draft_vocab_size": 100})
    assert small.feature_layers == (1, 3, 4) and small.model.lm_head.weight.shape == (100, HIDDEN)
    again = build(target, {"drafter": "random"})
    assert torch.equal(again.model.fc.weight, drafter.model.fc.weight)  # seeded
    reference = decode(target, AutoregressiveMethod(target.device), PROMPT, max_new=24)
    assert decode(target, small, PROMPT, max_new=24).output_ids == reference.output_ids
