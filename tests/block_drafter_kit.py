"""Test support for the block drafters (DLite, DFlash, DSpark): synthetic released-format checkpoints, a decode
helper, and the draft-cache rebuild check.

The synthetic checkpoints spell out the released config.json keys and safetensors key names and shapes
independently of the implementation (methods.md §1.2, §3.2, §4.2), scaled down to the tiny targets. Weights are
random, stored in bfloat16 like the releases, large enough that the drafters' outputs are far from uniform.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from evalsuite.engine import decode_turn
from evalsuite.methods.base import Drafter, Sampling
from evalsuite.runner import PrefixCache
from evalsuite.timing import DeviceClock

# Drafter layer sizes deliberately unlike the tiny target's (4 heads / 2 KV / head_dim 16): the drafter's
# attention shape must come from its own config.
HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, LAYERS = 2, 1, 24, 96, 2


def qwen3_fields(target, layers: int = LAYERS) -> dict:
    """Standard Qwen3 keys of a released drafter config, sized for `target`."""
    return {
        "model_type": "qwen3", "hidden_size": target.hidden_size, "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": layers, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "rope_scaling": None, "max_position_embeddings": 40960, "vocab_size": target.vocab_size,
        "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "layer_types": ["full_attention"] * layers, "use_cache": True,
    }


def layer_shapes(target, layers: int = LAYERS) -> dict[str, tuple[int, ...]]:
    h = target.hidden_size
    shapes = {}
    for i in range(layers):
        p = f"layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, h), p + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, h),
            p + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, h), p + "self_attn.o_proj.weight": (h, HEADS * HEAD_DIM),
            p + "self_attn.q_norm.weight": (HEAD_DIM,), p + "self_attn.k_norm.weight": (HEAD_DIM,),
            p + "mlp.gate_proj.weight": (INTERMEDIATE, h), p + "mlp.up_proj.weight": (INTERMEDIATE, h),
            p + "mlp.down_proj.weight": (h, INTERMEDIATE),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        }
    return shapes | {"norm.weight": (h,)}


def write_checkpoint(directory: Path, config: dict, shapes: dict[str, tuple[int, ...]], seed: int = 0) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in shapes.items():
        if len(shape) == 1 and name.endswith(".bias"):
            value = torch.randn(shape, generator=generator) * 0.1
        elif len(shape) == 1:  # norm weights
            value = 0.5 + torch.rand(shape, generator=generator)
        else:
            value = torch.randn(shape, generator=generator) * 0.3
        tensors[name] = value.to(torch.bfloat16)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory


def zlab_checkpoint(directory, target, layer_ids=(0, 1, 2), block_size: int = 16, mask_token_id: int = 3) -> Path:
    """`z-lab/Qwen3-*-DFlash-b16` format."""
    config = qwen3_fields(target) | {
        "architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": block_size, "num_target_layers": target.num_layers,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(layer_ids)},
    }
    h = target.hidden_size
    shapes = layer_shapes(target) | {"fc.weight": (h, len(layer_ids) * h), "hidden_norm.weight": (h,)}
    return write_checkpoint(directory, config, shapes)


def deepspec_checkpoint(directory, target, layer_ids=(0, 1, 2), block_size: int = 7, markov_rank: int = 16,
                        markov_head_type: str = "vanilla", confidence: bool = True, with_markov: bool = True,
                        own_embed_head: bool = True, mask_token_id: int = 3) -> Path:
    """`deepseek-ai/dspark_qwen3_*_block7` format; `markov_rank=0, confidence=False` is `dflash_qwen3_*_block7`."""
    config = qwen3_fields(target) | {
        "architectures": ["Qwen3DSparkModel"], "num_target_layers": target.num_layers, "block_size": block_size,
        "mask_token_id": mask_token_id, "target_layer_ids": list(layer_ids), "num_anchors": 512,
        "enable_confidence_head": confidence, "markov_rank": markov_rank,
    }
    if markov_rank:
        config["markov_head_type"] = markov_head_type
    if confidence:
        config["confidence_head_with_markov"] = with_markov
    h, v, r = target.hidden_size, target.vocab_size, markov_rank
    shapes = layer_shapes(target) | {"fc.weight": (h, len(layer_ids) * h), "hidden_norm.weight": (h,)}
    if own_embed_head:
        shapes |= {"embed_tokens.weight": (v, h), "lm_head.weight": (v, h)}
    if r:
        shapes |= {"markov_head.markov_w1.weight": (v, r), "markov_head.markov_w2.weight": (v, r)}
        if markov_head_type == "gated":
            shapes |= {"markov_head.gate_proj.weight": (r, h + r), "markov_head.gate_proj.bias": (r,)}
        if markov_head_type == "rnn":
            shapes |= {"markov_head.joint_proj.weight": (3 * r, 2 * r + h), "markov_head.joint_proj.bias": (3 * r,)}
    if confidence:
        shapes |= {"confidence_head.proj.weight": (1, h + (r if with_markov else 0)), "confidence_head.proj.bias": (1,)}
    return write_checkpoint(directory, config, shapes)


def dlite_checkpoint(directory, target, layer_ids=(0, 1, 2, 3), anchor_group_size: int = 1, block_size: int = 8,
                     rank: int = 16, mask_token_id: int = 3, **dlite_overrides) -> Path:
    """`SJTU-DAI-Sys/Qwen3-*-DLite` format (a Qwen3 config with `dlite_config`)."""
    dlite_config = {
        "architecture_version": "dlite_v1", "model_role": "pivot_q_student", "anchor_group_size": anchor_group_size,
        "chs_num_layers": len(layer_ids), "target_layer_ids": list(layer_ids), "sequential_head": "rnn",
        "sequential_rank": rank, "mask_token_id": mask_token_id,
    } | dlite_overrides
    config = qwen3_fields(target) | {"architectures": ["DLiteDraftModel"], "block_size": block_size,
                                     "num_target_layers": target.num_layers, "dlite_config": dlite_config}
    h, v = target.hidden_size, target.vocab_size
    shapes = layer_shapes(target) | {
        "layer_depth_embedding.weight": (target.num_layers, h), "context_norm.weight": (h,),
        "sequential_head.prev_token_embedding.weight": (v, rank), "sequential_head.output_proj.weight": (v, rank),
        "sequential_head.state_proj.weight": (2 * rank, 2 * rank), "sequential_head.state_proj.bias": (2 * rank,),
        "sequential_head.state_hidden_mlp.weight": (rank, rank + h), "sequential_head.state_hidden_mlp.bias": (rank,),
    }
    return write_checkpoint(directory, config, shapes)


def decode(target, drafter: Drafter, prompt: list[int], max_new: int, k: int, sampling: Sampling = Sampling(),
           seed: int = 0):
    prefix = PrefixCache(target, drafter.feature_layers)
    prefix.prefill(prompt)
    return decode_turn(target, drafter, prefix.cache, torch.tensor(prompt), prefix.features_for(drafter.feature_layers),
                       prefix.last_logits, k, sampling, max_new, torch.Generator().manual_seed(seed),
                       DeviceClock(target.device))


PROMPT = [1, 40, 41, 42, 43, 40, 41, 42, 100, 7, 7, 9, 100, 7, 55, 56, 57, 58, 200, 201]


def assert_cache_matches_rebuild(drafter, target, prompt: list[int], max_new: int, k: int) -> int:
    """Decode a turn; at every step also rebuild the draft cache from scratch (a fresh copy of the drafter fed
    the whole context so far) and check that its block outputs equal the incremental drafter's.
    Returns the number of steps checked."""
    history: dict = {}
    start_turn, commit, block_outputs = drafter.start_turn, drafter.commit, drafter.block_outputs
    checked = []

    def spy_start(ids, features):
        history["ids"], history["features"] = ids.clone(), features.clone()
        start_turn(ids, features)

    def spy_commit(new_ids, new_features):
        history["ids"] = torch.cat([history["ids"], new_ids])
        history["features"] = torch.cat([history["features"], new_features])
        commit(new_ids, new_features)

    def spy_block():
        incremental = block_outputs()
        fresh = copy.copy(drafter)
        fresh.cache = type(drafter.cache)(drafter.cache.num_layers)
        type(drafter).start_turn(fresh, history["ids"], history["features"])
        rebuilt = type(drafter).block_outputs(fresh)
        torch.testing.assert_close(incremental, rebuilt, rtol=1e-4, atol=1e-4)
        checked.append(drafter.cache.length)
        return incremental

    drafter.start_turn, drafter.commit, drafter.block_outputs = spy_start, spy_commit, spy_block
    try:
        decode(target, drafter, prompt, max_new, k)
    finally:
        del drafter.start_turn, drafter.commit, drafter.block_outputs
    assert checked == sorted(checked) and len(checked) > 10
    return len(checked)


def scripted_commits(drafter, steps: list[int], hidden_size: int, seed: int = 0) -> None:
    """Drive propose-side forwards with commits of chosen sizes (as after rejections at different places) and
    compare each block output with a from-scratch rebuild."""
    generator = torch.Generator().manual_seed(seed)
    layers = len(drafter.feature_layers)
    total = 12 + sum(steps)
    ids = torch.randint(4, 200, (total + 1,), generator=generator)
    features = torch.randn(total, layers, hidden_size, generator=generator)
    n = 12
    drafter.start_turn(ids[: n + 1], features[:n])
    for m in [0] + steps:
        if m:
            drafter.commit(ids[n + 1: n + m + 1], features[n: n + m])
            n += m
        incremental = drafter.block_outputs()
        fresh = copy.copy(drafter)
        fresh.cache = type(drafter.cache)(drafter.cache.num_layers)
        fresh.start_turn(ids[: n + 1], features[:n])
        torch.testing.assert_close(incremental, fresh.block_outputs(), rtol=1e-4, atol=1e-4)
        assert drafter.cache.length == n
