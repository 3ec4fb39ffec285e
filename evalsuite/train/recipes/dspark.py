"""DSpark (DeepSpec `Qwen3DSparkModel`): 0.1·CE + 0.9·‖p_d − p_t‖₁ + 1.0·BCE(confidence), position-weighted
exp(-j/γ) for slots j = 0 … B-1 (γ = 4), with the vanilla Markov head (docs/methods.md §4.3, DeepSpec `loss.py`).

The DFlash backbone over the fused context rows 0 … a-1; block [x_a, MASK × (B-1)] at positions a … a+B-1;
*every* slot j predicts the token at a+j+1 with logits lm_head(h_j) + markov_w2(markov_w1[x_{a+j}]) (the
previous token teacher-forced with the data, x_a for slot 0). The confidence head reads [h_j; markov_w1[x]]
and learns the soft acceptance label 1 − ½‖p_d − p_t‖₁ (detached) by BCE. The target distribution is its
top-K from the feature cache.

Checkpoint: the released flat config keys; `embed_tokens`/`lm_head` are NOT stored (the released format
holds frozen copies of the target's, 2 × V × H = 113 MB here): the `dspark` loader then uses the target's own
embedding and lm_head, which hold the same values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from evalsuite.methods.draft_layers import default_mask_token_id, init_random_, qwen3_config
from evalsuite.methods.dspark import DeepSpecBlockModel, DeepSpecLayout
from evalsuite.train import losses
from evalsuite.train.features import FeatureCache
from evalsuite.train.loop import Batch, Stage
from evalsuite.train.recipes.common import (
    Recipe, SequenceReader, SubVocabulary, block_targets, chain_tau, feature_rms, param_count, qwen3_layer_config,
    register_recipe, save_checkpoint, scale_fusion_init_, target_final_norm, training_vocabulary,
)
from evalsuite.train.recipes.dflash import block_hidden, zlab_feature_layers


@dataclass(frozen=True)
class DSparkOptions:
    layers: int = 2
    intermediate_size: int = 384
    feature_layers: int = 3
    block_size: int = 7  # 7 slots, all predicting: 7 proposals
    markov_rank: int = 8
    gamma: float = 4.0
    ce_weight: float = 0.1
    l1_weight: float = 0.9
    confidence_weight: float = 1.0
    lr: float = 2e-3
    batch_seqs: int = 4
    anchors_per_seq: int = 16
    # training softmax over the tokens in the target's top-N somewhere (0 = full vocabulary); safe here because
    # the lm_head is the target's, frozen (docs/training.md, "Training vocabulary")
    train_vocab_top: int = 8
    seed: int = 0


def feature_layers(num_target_layers: int, options: DSparkOptions = DSparkOptions()) -> tuple[int, ...]:
    return zlab_feature_layers(num_target_layers, options.feature_layers)


@register_recipe
class DSparkRecipe(Recipe):
    method = "dspark"
    options_type = DSparkOptions
    default_steps = 4000  # the shipped default drafter's schedule (baselines/drafters/README.md)
    feature_layers = staticmethod(feature_layers)

    def __init__(self, target, cache: FeatureCache, options: DSparkOptions, train_sequences: list[int]):
        super().__init__(target, options)
        ids = self.ids
        mask, self.mask_how = default_mask_token_id(target)
        rank = options.markov_rank
        self.layout = DeepSpecLayout(options.block_size, mask, ids, target.num_layers, rank,
                                     "vanilla" if rank else None, True, rank > 0)
        self.layer_config = qwen3_layer_config(target, options.layers, options.intermediate_size)
        cfg = qwen3_config(self.layer_config, "dspark training")
        torch.manual_seed(options.seed)
        self.model = DeepSpecBlockModel(cfg, self.layout, own_embed=False, own_head=False).to(self.device)
        init_random_(self.model, options.seed)
        with torch.no_grad():  # outputs feed the target's lm_head: start from the target's final norm scale
            self.model.norm.weight.copy_(target_final_norm(target))
        scale_fusion_init_(self.model.fc, feature_rms(cache, cache.layer_index(ids, "dspark"), train_sequences))
        self.embed, self.lm_head = target.embed_tokens, target.lm_head
        self.read = SequenceReader(cache, ids, "dspark", self.device)
        self.offsets = torch.arange(1, options.block_size + 1, device=self.device)  # slot j → a+j+1
        self.weights = losses.position_weights(options.block_size, options.gamma, self.device)
        self.sub = None
        if options.train_vocab_top > 0:
            vocab = training_vocabulary(cache, train_sequences, options.train_vocab_top)
            self.sub = SubVocabulary(vocab, target.vocab_size, self.device)

    def _outputs(self, batch: Batch, full: bool = False):
        """Per sequence: corrected logits (over the training vocabulary unless `full`), confidence logits and
        targets. The Markov bias is added before the softmax, over the same rows."""
        m = self.model
        sub = None if full else self.sub
        head_w = self.lm_head.weight if sub is None else self.lm_head.weight[sub.ids]
        for seq_id, anchors in zip(batch.seqs, batch.anchors):
            seq = self.read(seq_id)
            anchors = torch.as_tensor(anchors, device=self.device)
            hidden = block_hidden(m, self.embed, seq, anchors, self.options.block_size, self.layout.mask_token_id)
            tgt = block_targets(seq, anchors, self.offsets)
            logits = torch.nn.functional.linear(hidden, head_w)
            features = hidden
            if self.layout.markov_rank:
                e = m.markov_head.markov_w1(tgt["prev"])  # the previous token, x_a for slot 0
                w2 = m.markov_head.markov_w2.weight
                logits = logits + torch.nn.functional.linear(e, w2 if sub is None else w2[sub.ids])
                if self.layout.confidence_with_markov:
                    features = torch.cat([hidden, e], dim=-1)
            yield logits, m.confidence_head(features), tgt if sub is None else sub.targets(tgt)

    def loss(self, batch: Batch, fraction: float) -> dict[str, torch.Tensor]:
        o = self.options
        totals: dict[str, torch.Tensor] = {}
        n = 0
        for logits, confidence, tgt in self._outputs(batch):
            tv = losses.tv_to_sparse_target(logits, tgt["topk_ids"], tgt["topk_probs"])
            terms = losses.dspark_loss(logits, confidence, tv, tgt["labels"], self.weights[None] * tgt["valid"],
                                       o.ce_weight, o.l1_weight, o.confidence_weight)
            for key, value in terms.items():
                totals[key] = totals.get(key, 0.0) + value
            n += 1
        return {k: v / n for k, v in totals.items()}

    def modules(self) -> dict[str, nn.Module]:
        return {"model": self.model}

    def stages(self, steps: int) -> list[Stage]:
        o = self.options
        return [Stage("dspark", steps, o.lr, lambda: list(self.model.parameters()), self.loss, o.batch_seqs,
                      o.anchors_per_seq)]

    def validate(self, batch: Batch) -> dict[str, float]:
        preds, labels, valid, conf_err = [], [], [], []
        for logits, confidence, tgt in self._outputs(batch, full=True):
            preds.append(logits.argmax(-1))
            labels.append(tgt["labels"])
            valid.append(tgt["valid"])
            accept = 1.0 - losses.tv_to_sparse_target(logits, tgt["topk_ids"], tgt["topk_probs"])
            conf_err.append((torch.sigmoid(confidence) - accept).abs()[tgt["valid"]])
        preds, labels, valid = torch.cat(preds), torch.cat(labels), torch.cat(valid)
        return {"tau": chain_tau(preds, labels, valid), "acc1": float((preds[:, 0] == labels[:, 0]).float().mean()),
                "confidence_abs_error": float(torch.cat(conf_err).mean())}

    def export(self, out_dir: Path) -> dict:
        lay = self.layout
        config = dict(self.layer_config)
        config.update(architectures=["Qwen3DSparkModel"], model_type="qwen3", block_size=lay.block_size,
                      mask_token_id=lay.mask_token_id, target_layer_ids=list(lay.target_layer_ids),
                      num_target_layers=lay.num_target_layers, num_anchors=self.options.anchors_per_seq,
                      enable_confidence_head=lay.confidence_head,
                      confidence_head_with_markov=lay.confidence_with_markov, markov_rank=lay.markov_rank,
                      markov_head_type=lay.markov_head_type or "vanilla", tie_word_embeddings=False)
        save_checkpoint(out_dir, config, self.model.state_dict())
        return config

    def released_module(self):
        return self.model, ()

    def describe(self) -> dict:
        return {"options": asdict(self.options), "parameters": param_count(self.model),
                "training_vocabulary": int(self.sub.ids.numel()) if self.sub is not None else self.target.vocab_size,
                "target_layer_ids": list(self.layout.target_layer_ids), "mask_token": self.mask_how,
                "embed_tokens": "target's (not stored; the loader falls back to the target's)",
                "lm_head": "target's (not stored; the loader falls back to the target's)"}
