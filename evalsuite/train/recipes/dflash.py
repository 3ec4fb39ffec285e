"""DFlash (z-lab layout): position-weighted CE over random anchor blocks (docs/methods.md §3.3, DSpark paper's
description of DFlash training; DeepSpec's DFlash config: CE only, γ = 4).

Per sampled anchor a (a reply token) the block is [x_a, MASK × (B-1)] at absolute positions a … a+B-1, seeing
the fused target features of positions 0 … a-1 (exactly the draft KV cache at inference); mask k predicts the
token at a+k through the target's frozen lm_head, labelled with the target's greedy token there, weighted
exp(-(k-1)/γ). All anchors of one sequence share that sequence's context rows (one fc pass, one K/V projection
per layer). Embeddings and lm_head are the target's, frozen and not stored (z-lab format).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from evalsuite.methods.draft_layers import (
    FusedContextBackbone, default_mask_token_id, evenly_spaced_zlab, init_random_, qwen3_config,
)
from evalsuite.train import losses
from evalsuite.train.features import FeatureCache
from evalsuite.train.forward import SharedContext, block_layers
from evalsuite.train.loop import Batch, Stage
from evalsuite.train.recipes.common import (
    Recipe, SequenceReader, SubVocabulary, block_targets, chain_tau, feature_rms, param_count, qwen3_layer_config,
    register_recipe, save_checkpoint, scale_fusion_init_, target_final_norm, training_vocabulary,
)


@dataclass(frozen=True)
class DFlashOptions:
    layers: int = 2
    intermediate_size: int = 384
    feature_layers: int = 3
    block_size: int = 8  # anchor + 7 masks: 7 proposals
    gamma: float = 4.0
    lr: float = 2e-3
    batch_seqs: int = 4
    anchors_per_seq: int = 16
    # training softmax over the tokens in the target's top-N somewhere (0 = full vocabulary); safe here because
    # the lm_head is the target's, frozen (docs/training.md, "Training vocabulary")
    train_vocab_top: int = 8
    seed: int = 0


def zlab_feature_layers(num_target_layers: int, count: int) -> tuple[int, ...]:
    """z-lab's spread (1 … L-3) without the final, post-norm layer."""
    ids = tuple(j for j in evenly_spaced_zlab(num_target_layers, count) if j != num_target_layers - 1)
    return ids or (0,)


def feature_layers(num_target_layers: int, options: DFlashOptions = DFlashOptions()) -> tuple[int, ...]:
    return zlab_feature_layers(num_target_layers, options.feature_layers)


def block_hidden(model: FusedContextBackbone, embed: nn.Embedding, seq, anchors: torch.Tensor, block_size: int,
                 mask_token_id: int) -> torch.Tensor:
    """The normed outputs [A, B, H] of the blocks [x_a, MASK × (B-1)] for the anchors of one sequence."""
    device = anchors.device
    ids = torch.full((anchors.shape[0], block_size), mask_token_id, device=device)
    ids[:, 0] = seq.tokens[anchors]
    last = int(anchors.max())
    rows = model.fuse(seq.hidden[:last])  # context rows 0 … max anchor - 1
    visible = torch.arange(last, device=device)[None, :] < anchors[:, None]
    positions = anchors[:, None] + torch.arange(block_size, device=device)[None]
    return block_layers(model, embed(ids).float(), positions, shared=SharedContext(rows, visible))


@register_recipe
class DFlashRecipe(Recipe):
    method = "dflash"
    options_type = DFlashOptions
    default_steps = 4400  # the shipped default drafter's schedule (baselines/drafters/README.md)
    feature_layers = staticmethod(feature_layers)

    def __init__(self, target, cache: FeatureCache, options: DFlashOptions, train_sequences: list[int]):
        super().__init__(target, options)
        self.mask, self.mask_how = default_mask_token_id(target)
        self.layer_config = qwen3_layer_config(target, options.layers, options.intermediate_size)
        cfg = qwen3_config(self.layer_config, "dflash training")
        torch.manual_seed(options.seed)
        self.model = FusedContextBackbone(cfg, len(self.ids)).to(self.device)
        init_random_(self.model, options.seed)
        with torch.no_grad():  # outputs feed the target's lm_head: start from the target's final norm scale
            self.model.norm.weight.copy_(target_final_norm(target))
        scale_fusion_init_(self.model.fc, feature_rms(cache, cache.layer_index(self.ids, "dflash"), train_sequences))
        self.embed, self.lm_head = target.embed_tokens, target.lm_head
        self.read = SequenceReader(cache, self.ids, "dflash", self.device)
        self.offsets = torch.arange(1, options.block_size, device=self.device)
        self.weights = losses.position_weights(options.block_size - 1, options.gamma, self.device)
        self.sub = None
        if options.train_vocab_top > 0:
            vocab = training_vocabulary(cache, train_sequences, options.train_vocab_top)
            self.sub = SubVocabulary(vocab, target.vocab_size, self.device)

    def _logits(self, batch: Batch, full: bool = False):
        """Per sequence: logits of the mask slots and their targets; over the training vocabulary unless
        `full` (validation reads the full vocabulary, as the drafter does)."""
        sub = None if full else self.sub
        weight = self.lm_head.weight if sub is None else self.lm_head.weight[sub.ids]
        for seq_id, anchors in zip(batch.seqs, batch.anchors):
            seq = self.read(seq_id)
            anchors = torch.as_tensor(anchors, device=self.device)
            out = block_hidden(self.model, self.embed, seq, anchors, self.options.block_size, self.mask)
            tgt = block_targets(seq, anchors, self.offsets)
            yield torch.nn.functional.linear(out[:, 1:], weight), tgt if sub is None else sub.targets(tgt)

    def loss(self, batch: Batch, fraction: float) -> dict[str, torch.Tensor]:
        total = 0.0
        for n, (logits, tgt) in enumerate(self._logits(batch), start=1):
            total = total + losses.weighted_ce(logits, tgt["labels"], self.weights[None] * tgt["valid"])
        ce = total / n
        return {"loss": ce, "ce": ce}

    def modules(self) -> dict[str, nn.Module]:
        return {"model": self.model}

    def stages(self, steps: int) -> list[Stage]:
        o = self.options
        return [Stage("ce", steps, o.lr, lambda: list(self.model.parameters()), self.loss, o.batch_seqs,
                      o.anchors_per_seq)]

    def validate(self, batch: Batch) -> dict[str, float]:
        preds, labels, valid = [], [], []
        for logits, tgt in self._logits(batch, full=True):
            preds.append(logits.argmax(-1))
            labels.append(tgt["labels"])
            valid.append(tgt["valid"])
        preds, labels, valid = torch.cat(preds), torch.cat(labels), torch.cat(valid)
        return {"tau": chain_tau(preds, labels, valid), "acc1": float((preds[:, 0] == labels[:, 0]).float().mean())}

    def export(self, out_dir: Path) -> dict:
        config = dict(self.layer_config)
        config.update(architectures=["DFlashDraftModel"], model_type="qwen3", block_size=self.options.block_size,
                      num_target_layers=self.target.num_layers,
                      dflash_config={"mask_token_id": self.mask, "target_layer_ids": list(self.ids)})
        save_checkpoint(out_dir, config, self.model.state_dict())
        return config

    def released_module(self):
        return self.model, ()

    def describe(self) -> dict:
        return {"options": asdict(self.options), "parameters": param_count(self.model),
                "training_vocabulary": int(self.sub.ids.numel()) if self.sub is not None else self.target.vocab_size,
                "target_layer_ids": list(self.ids), "mask_token": self.mask_how,
                "embed_tokens": "target (frozen, not stored)", "lm_head": "target (frozen, not stored)"}
