"""EAGLE-3 (SpecForge `LlamaForCausalLMEagle3` format, reduced draft vocabulary): training-time test unrolled
over 7 steps (docs/methods.md §2; SpecForge `docs/concepts/EAGLE3.md`, DeepSpec `ttt_length 7`,
`step_loss_decay 0.8`).

Step 0 pairs the fused target feature of position i with the data token i+1 at position i (one draft-cache
entry per context position, causal attention); step k feeds the step k-1 output of row i back with the data
token i+k+1 at position i+k and attends to the step-0 entries 0 … i plus its own row's entries of steps 1 … k
(`forward.eagle3_ttt`). Step k row i predicts the token at i+k+2; the loss is the soft cross-entropy against
the target's distribution there (its top-K, restricted to the draft vocabulary and renormalised), over reply
tokens, weighted 0.8^k; positions whose target greedy token is outside the draft vocabulary are skipped
(SpecForge).

Draft vocabulary: the `draft_vocab_size` most frequent target greedy tokens in the training replies
(SpecForge builds d2t/t2d from token counts of the training data the same way); d2t[i] = target_id − i.
The embedding is the target's (frozen, not stored: the SpecForge format loads the target's when absent).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from evalsuite.methods.draft_layers import init_random_
from evalsuite.methods.eagle3 import SPECFORGE, Eagle3Model, spec_from_config, specforge_layer_ids
from evalsuite.train import losses
from evalsuite.train.features import FeatureCache
from evalsuite.train.forward import eagle3_ttt
from evalsuite.train.loop import Batch, Stage
from evalsuite.train.recipes.common import (
    Recipe, SequenceReader, chain_tau, draft_vocabulary, feature_rms, param_count, register_recipe,
    save_checkpoint, scale_fusion_init_, target_final_norm,
)


@dataclass(frozen=True)
class Eagle3Options:
    intermediate_size: int = 320
    draft_vocab_size: int = 2048
    ttt_steps: int = 7
    step_decay: float = 0.8
    lr: float = 2e-3
    batch_seqs: int = 1
    seed: int = 0


def feature_layers(num_target_layers: int, options: Eagle3Options = Eagle3Options()) -> tuple[int, ...]:
    return specforge_layer_ids(num_target_layers)


@register_recipe
class Eagle3Recipe(Recipe):
    method = "eagle3"
    options_type = Eagle3Options
    default_steps = 2500  # the shipped default drafter's schedule (baselines/drafters/README.md)
    feature_layers = staticmethod(feature_layers)

    def __init__(self, target, cache: FeatureCache, options: Eagle3Options, train_sequences: list[int]):
        super().__init__(target, options)
        L = target.num_layers
        config = {k: v for k, v in target.config.to_dict().items()
                  if k not in ("model_type", "auto_map", "architectures", "transformers_version")}
        config.update(architectures=[SPECFORGE], model_type="llama", num_hidden_layers=1,
                      layer_types=["full_attention"], vocab_size=target.vocab_size, hidden_size=target.hidden_size,
                      target_hidden_size=target.hidden_size, intermediate_size=options.intermediate_size,
                      draft_vocab_size=options.draft_vocab_size, tie_word_embeddings=False,
                      eagle_config={"eagle_aux_hidden_state_layer_ids": list(self.ids)})
        self.config = config
        self.spec = spec_from_config(config, L, "eagle3 training")
        torch.manual_seed(options.seed)
        model = Eagle3Model(self.spec).to(self.device)
        init_random_(model, options.seed)
        model.share_embedding(target.embed_tokens)
        vocab = draft_vocabulary(cache, train_sequences, options.draft_vocab_size, target.vocab_size)
        with torch.no_grad():
            # start the draft head from the target's rows of its lm_head and its final norm scale
            model.lm_head.weight.copy_(target.lm_head.weight[vocab.to(target.lm_head.weight.device)])
            model.norm.weight.copy_(target_final_norm(target))
            model.d2t.copy_(vocab - torch.arange(vocab.numel()))
            model.t2d.zero_()
            model.t2d[vocab] = True
        scale_fusion_init_(model.fc, feature_rms(cache, cache.layer_index(self.ids, "eagle3"), train_sequences))
        self.model = model
        self.read = SequenceReader(cache, self.ids, "eagle3", self.device)
        self.train_sequences = train_sequences
        self._use_vocabulary(vocab)

    def _use_vocabulary(self, vocab: torch.Tensor) -> None:
        """Map target ids to draft ids (-1: outside the draft vocabulary) and measure its coverage."""
        self.to_draft = torch.full((self.target.vocab_size,), -1, dtype=torch.long, device=self.device)
        self.to_draft[vocab.to(self.device)] = torch.arange(vocab.numel(), device=self.device)
        self.vocab_coverage = self._coverage(self.read.cache, self.train_sequences)

    def _coverage(self, cache: FeatureCache, sequences: list[int]) -> float:
        hits = total = 0
        for seq in sequences:
            start, prompt_end, end = cache.span(seq)
            greedy = torch.from_numpy(np.asarray(cache.greedy[max(prompt_end - 1, start):end], dtype=np.int64))
            hits += int((self.to_draft.cpu()[greedy] >= 0).sum())
            total += greedy.numel()
        return hits / max(total, 1)

    def _steps(self, seq_id: int):
        """Per TTT step: draft logits [T, Vd], mapped target top-K (ids, probs), greedy labels (draft ids),
        validity [T] of the prediction of token i+k+2 (a reply token inside the sequence)."""
        seq = self.read(seq_id)
        T, steps = seq.length, self.options.ttt_steps
        pad = torch.zeros(steps + 1, dtype=torch.long, device=self.device)
        tokens = torch.cat([seq.tokens, pad])
        outputs = eagle3_ttt(self.model, self.model.fuse(seq.hidden), tokens, steps)
        rows = torch.arange(T, device=self.device)
        for k, out in enumerate(outputs):
            predicted = rows + k + 2  # position of the token row i predicts at step k
            src = (predicted - 1).clamp(max=T - 1)
            label = self.to_draft[seq.greedy[src]]
            valid = (predicted < T) & (predicted >= seq.prompt_end) & (label >= 0)
            ids = self.to_draft[seq.topk_ids[src]]
            probs = seq.topk_probs[src] * (ids >= 0)
            yield k, self.model.logits(out), ids.clamp(min=0), probs, label, valid, predicted

    def loss(self, batch: Batch, fraction: float) -> dict[str, torch.Tensor]:
        o = self.options
        total = 0.0
        first = 0.0
        for seq_id in batch.seqs:
            for k, logits, ids, probs, _, valid, _ in self._steps(seq_id):
                term = losses.sparse_soft_ce(logits, ids, probs, valid.float())
                total = total + (o.step_decay ** k) * term
                if k == 0:
                    first = first + term
        n = len(batch.seqs)
        return {"loss": total / n, "ce_step0": first / n}

    def modules(self) -> dict[str, nn.Module]:
        return {"model": self.model}

    def trainable(self) -> list[nn.Parameter]:
        return [p for n, p in self.model.named_parameters() if not n.startswith("embed_tokens")]

    def stages(self, steps: int) -> list[Stage]:
        o = self.options
        return [Stage("ttt", steps, o.lr, self.trainable, self.loss, o.batch_seqs, 1,
                      on_start=lambda: self.model.embed_tokens.requires_grad_(False))]

    def validate(self, batch: Batch) -> dict[str, float]:
        """Greedy chains from the sampled anchors: anchor a is row a-1 (feature a-1 paired with token a)."""
        preds, labels, valid = [], [], []
        for seq_id, anchors in zip(batch.seqs, batch.anchors):
            rows = torch.as_tensor(anchors, device=self.device) - 1
            p, l_, v = [], [], []
            for k, logits, _, _, label, ok, _ in self._steps(seq_id):
                p.append(logits[rows].argmax(-1))
                l_.append(label[rows])
                v.append(ok[rows])
            preds.append(torch.stack(p, 1))
            labels.append(torch.stack(l_, 1))
            valid.append(torch.stack(v, 1))
        preds, labels, valid = torch.cat(preds), torch.cat(labels), torch.cat(valid)
        return {"tau": chain_tau(preds, labels, valid), "acc1": float((preds[:, 0] == labels[:, 0]).float().mean())}

    def export(self, out_dir: Path) -> dict:
        state = {k: v for k, v in self.model.state_dict().items() if not k.startswith("embed_tokens")}
        save_checkpoint(out_dir, self.config, state)
        return self.config

    def released_module(self):
        return self.model, ("embed_tokens",)

    def load_init(self, directory: Path) -> dict:
        """The warm start brings its own draft vocabulary (d2t): the label mapping follows it."""
        info = super().load_init(directory)
        self._use_vocabulary(self.model.d2t + torch.arange(self.model.d2t.numel(), device=self.model.d2t.device))
        return info

    def describe(self) -> dict:
        return {"options": asdict(self.options),
                "parameters": param_count(self.model, exclude=("embed_tokens",)),
                "target_layer_ids": list(self.ids), "draft_vocab_coverage_of_train_replies": self.vocab_coverage,
                "embed_tokens": "target (frozen, not stored)", "format": SPECFORGE}

