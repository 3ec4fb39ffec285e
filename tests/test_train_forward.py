"""The batched training forwards compute exactly what the drafters compute at inference, on the same weights."""

from __future__ import annotations

import pytest
import torch

from evalsuite.methods.dlite import DLiteModel, DLiteSettings, block_positions
from evalsuite.methods.draft_layers import FusedContextBackbone, init_random_, qwen3_config
from evalsuite.methods.eagle3 import DraftKVCache, Eagle3Model, spec_for_target
from evalsuite.target.model import TargetModel
from evalsuite.testing import build_tiny_target
from evalsuite.train.forward import SharedContext, block_layers, eagle3_ttt
from evalsuite.train.recipes.common import qwen3_layer_config
from evalsuite.train.recipes.dlite import rnn_logits


def _scaled(module, seed):
    init_random_(module, seed)
    with torch.no_grad():  # larger weights than N(0, 0.02), so that mistakes show in the outputs
        for p in module.parameters():
            if p.dim() > 1:
                p.mul_(10.0)
    return module.eval()


def test_block_layers_with_own_context_match_run_layers(tiny_llama_dir):
    target = TargetModel.load(str(tiny_llama_dir))
    cfg = qwen3_config(qwen3_layer_config(target, 2, 48), "test")
    settings = DLiteSettings(5, 1, (0, 1, 2, 3), 4, 8, 3)
    model = _scaled(DLiteModel(cfg, settings), 0)
    gen = torch.Generator().manual_seed(1)
    A, S, B, H = 3, 4, 5, target.hidden_size
    block, own = torch.randn(A, B, H, generator=gen), torch.randn(A, S, H, generator=gen)
    positions = block_positions(1, B, S)
    with torch.no_grad():
        batched = block_layers(model, block, positions[S:].expand(A, -1), own=own, own_pos=positions[:S].expand(A, -1))
        for i in range(A):
            single = model.run_layers(block[i], own[i], positions)
            torch.testing.assert_close(batched[i], single, rtol=1e-4, atol=1e-4)


def test_block_layers_with_shared_context_match_the_draft_cache_view(tiny_llama_dir):
    target = TargetModel.load(str(tiny_llama_dir))
    cfg = qwen3_config(qwen3_layer_config(target, 2, 48), "test")
    model = _scaled(FusedContextBackbone(cfg, 2), 2)
    gen = torch.Generator().manual_seed(3)
    T, B, H = 12, 4, target.hidden_size
    rows = torch.randn(T, H, generator=gen)
    anchors = torch.tensor([3, 7, 12])
    block = torch.randn(3, B, H, generator=gen)
    visible = torch.arange(T)[None] < anchors[:, None]
    positions = anchors[:, None] + torch.arange(B)[None]
    with torch.no_grad():
        batched = block_layers(model, block, positions, shared=SharedContext(rows, visible))
        for i, a in enumerate(anchors.tolist()):
            single = model.run_layers(block[i], rows[:a], torch.arange(a + B))
            torch.testing.assert_close(batched[i], single, rtol=1e-4, atol=1e-4)


def test_rnn_head_batched_matches_its_step(tiny_llama_dir):
    target = TargetModel.load(str(tiny_llama_dir))
    cfg = qwen3_config(qwen3_layer_config(target, 1, 32), "test")
    model = _scaled(DLiteModel(cfg, DLiteSettings(4, 1, (0, 3), 4, 6, 3)), 4)
    head = model.sequential_head
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(2, 3, target.hidden_size, generator=gen)
    prev = torch.randint(0, target.vocab_size, (2, 3), generator=gen)
    with torch.no_grad():
        batched = rnn_logits(head, hidden, prev)
        for a in range(2):
            state = hidden.new_zeros(head.rank)
            for k in range(3):
                latent, state = head.step(prev[a, k], hidden[a, k], state)
                torch.testing.assert_close(batched[a, k], head.output_proj(latent), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", ["specforge", "deepspec"])
def test_eagle3_training_time_test_matches_the_draft_cache(tmp_path, fmt):
    target = TargetModel.load(str(build_tiny_target(tmp_path, "qwen3", layers=8)))  # deep enough for 3/5 layers
    spec = spec_for_target(target, fmt)
    model = _scaled(Eagle3Model(spec), 6)
    gen = torch.Generator().manual_seed(7)
    T, steps = 9, 3
    fused = torch.randn(T, spec.hidden_size, generator=gen)
    tokens = torch.randint(0, spec.vocab_size, (T + steps,), generator=gen)
    with torch.no_grad():
        outputs = eagle3_ttt(model, fused, tokens, steps)
        for row in (0, 4, T - 1):
            # inference: the cache holds entries 0..row (feature i with token i+1), then each draft step appends
            # (previous output, next token) one position further
            cache = DraftKVCache(spec.num_key_value_heads, spec.head_dim, torch.float32, torch.device("cpu"))
            hidden = model(fused[: row + 1], tokens[1: row + 2], torch.arange(row + 1), cache)
            torch.testing.assert_close(outputs[0][row], hidden[0], rtol=1e-4, atol=1e-4)
            for k in range(1, steps):
                hidden = model(hidden, tokens[row + k + 1: row + k + 2], torch.tensor([row + k]), cache)
                torch.testing.assert_close(outputs[k][row], hidden[0], rtol=1e-4, atol=1e-4)
