"""DLite: the two-stage recipe of the DLite training repo (docs/methods.md §1.1), on `evalsuite.methods.dlite` modules.

Stage 1, teacher: a history-aware isomorphic teacher — the same backbone and RNN head as the student — whose
context is a sliding window of W fused history features fuse(t) = RMSNorm(Linear([h_first; h_mid; h_last]))
for positions a-W … a-1, followed by the student's S pivot slots (CHS of a-1), with global (absolute) RoPE
positions. Trained with position-weighted CE against the target's greedy tokens.
Stage 2a, distillation: the student (history-free: pivot slots only, local positions) starts from scratch,
its sequential head is a frozen copy of the teacher's, and it learns the teacher's block distribution by
position-weighted forward KL(teacher ‖ student).
Stage 2b, alignment: head unfrozen; λ_CE·CE(target greedy tokens) + λ_TV·TV(target distribution), position
weights exp(-(k-1)/γ); the first `blend_fraction` of it blends cosine-wise from the KL loss into this one.
The RNN head is teacher-forced with the data tokens (x_{k-1}), as in the reference trainer.

`single_stage=True` is the ablation: the student alone, trained with the stage-2b loss for the same number of
steps and the same batches.

History rows before position 0 (only when a prompt is shorter than W) repeat row 0.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from evalsuite.errors import UserError
from evalsuite.methods.dlite import DLiteModel, DLiteSettings, SequentialHead, block_positions, dlite_layer_ids
from evalsuite.methods.draft_layers import RMSNorm, default_mask_token_id, init_random_, qwen3_config
from evalsuite.train import losses
from evalsuite.train.features import FeatureCache
from evalsuite.train.forward import block_layers
from evalsuite.train.loop import Batch, Stage
from evalsuite.train.recipes.common import (
    Recipe, SequenceReader, SubVocabulary, block_targets, chain_tau, draft_vocabulary, feature_rms, fit_low_rank_head,
    lm_head_factors, param_count, qwen3_layer_config, register_recipe, save_checkpoint, scale_fusion_init_,
    target_final_norm, training_vocabulary,
)


@dataclass(frozen=True)
class DLiteOptions:
    layers: int = 2
    intermediate_size: int = 512
    rank: int = 32
    chs_num_layers: int = 7
    block_size: int = 8  # anchor + 7 masks: 7 proposals (the paper's K=7)
    history_window: int = 32
    gamma: float = 4.0
    ce_weight: float = 0.1
    tv_weight: float = 1.0
    teacher_fraction: float = 0.35
    distill_fraction: float = 0.25
    blend_fraction: float = 0.2
    teacher_lr: float = 2e-3
    lr: float = 2e-3
    batch_seqs: int = 4
    anchors_per_seq: int = 16
    single_stage: bool = False
    train_vocab_top: int = 0  # >0: training softmax over tokens in the target's top-N somewhere (0 = full vocabulary)
    draft_vocab: int = 0  # >0: the head's own vocabulary, the N most frequent greedy tokens (0 = the target's)
    init_head: bool = True  # --init copies the RNN head too (false: the backbone only; the head starts as without --init)
    head_warm_start_steps: int = 1500  # fit the rank-R head on the target's last hidden states first (0: SVD only)
    seed: int = 0


def feature_layers(num_target_layers: int, options: DLiteOptions = DLiteOptions()) -> tuple[int, ...]:
    return tuple(dlite_layer_ids(num_target_layers, min(options.chs_num_layers, num_target_layers)))


def rnn_logits(head: SequentialHead, hidden: torch.Tensor, prev: torch.Tensor,
               rows: torch.Tensor | None = None) -> torch.Tensor:
    """The RNN head over a block, batched and teacher-forced: hidden [A, K, H], prev [A, K] target ids → logits
    [A, K, rows of output_proj] (or over the rows `rows` only), by `SequentialHead.step` (state 0 at the start, G=1)."""
    state = hidden.new_zeros(hidden.shape[0], head.rank)
    latents = []
    for k in range(hidden.shape[1]):
        latent, state = head.step(prev[:, k], hidden[:, k], state)
        latents.append(latent)
    weight = head.output_proj.weight if rows is None else head.output_proj.weight[rows]
    return torch.nn.functional.linear(torch.stack(latents, dim=1), weight)


def init_from_target(model: DLiteModel, target, A: torch.Tensor, B: torch.Tensor) -> None:
    """Start the RNN head as a rank-R head of the target: output_proj = A, the hidden part of state_hidden_mlp = B
    (the state part 0), and the final norm = the target's, so the first logits are A B h on the drafter's output.
    A, B come from `lm_head_factors` (truncated SVD), refined by `fit_low_rank_head` unless the warm start is
    off. The papers train the head from scratch over far more steps."""
    head = model.sequential_head
    with torch.no_grad():
        head.output_proj.weight.copy_(A)
        head.state_hidden_mlp.weight.zero_()
        head.state_hidden_mlp.weight[:, head.rank:].copy_(B)
        model.norm.weight.copy_(target_final_norm(target))


class DLiteTeacher(nn.Module):
    """The student's architecture (`core`) plus the history fusion of the sliding window."""

    def __init__(self, cfg, settings: DLiteSettings):
        super().__init__()
        self.core = DLiteModel(cfg, settings)
        self.history_fc = nn.Linear(3 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.history_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


@register_recipe
class DLiteRecipe(Recipe):
    method = "dlite"
    options_type = DLiteOptions
    default_steps = 6000  # the shipped default drafter's schedule (baselines/drafters/README.md)
    feature_layers = staticmethod(feature_layers)

    def __init__(self, target, cache: FeatureCache, options: DLiteOptions, train_sequences: list[int]):
        super().__init__(target, options)
        L, ids = target.num_layers, self.ids
        mask, self.mask_how = default_mask_token_id(target)
        vocab = None  # the head's draft vocabulary (target ids), None: the whole vocabulary
        if options.draft_vocab > 0:
            if options.train_vocab_top > 0:
                raise UserError("dlite: draft_vocab and train_vocab_top both restrict the head's softmax; set one")
            if options.draft_vocab > target.vocab_size:
                raise UserError(f"dlite: draft_vocab {options.draft_vocab} exceeds the target's vocabulary "
                                f"({target.vocab_size})")
            if options.draft_vocab < target.vocab_size:
                vocab = draft_vocabulary(cache, train_sequences, options.draft_vocab, target.vocab_size)
        self.settings = DLiteSettings(options.block_size, 1, ids, L, options.rank, mask,
                                      draft_vocab_size=None if vocab is None else vocab.numel())
        self.layer_config = qwen3_layer_config(target, options.layers, options.intermediate_size)
        cfg = qwen3_config(self.layer_config, "dlite training")
        torch.manual_seed(options.seed)
        self.student = DLiteModel(cfg, self.settings).to(self.device)
        init_random_(self.student, options.seed)
        self.teacher = None
        if not options.single_stage:
            self.teacher = DLiteTeacher(cfg, self.settings).to(self.device)
            init_random_(self.teacher, options.seed + 1)
        slot_rms = feature_rms(cache, cache.layer_index(ids, "dlite"), train_sequences, normalize=True)
        A, B = lm_head_factors(target, options.rank, vocab)
        self.head_fit = {"steps": 0}
        if options.head_warm_start_steps > 0:
            self.head_fit = fit_low_rank_head(cache, train_sequences, ids[-1], A, B, options.head_warm_start_steps,
                                              seed=options.seed, vocab=vocab)
        for model in [self.student] + ([self.teacher.core] if self.teacher is not None else []):
            init_from_target(model, target, A, B)
            if vocab is not None:
                model.sequential_head.use_vocabulary(vocab)
            with torch.no_grad():  # slots start standardised: RMSNorm, then each dimension divided by its scale
                model.context_norm.weight.copy_(1.0 / slot_rms.pow(2).mean(0).sqrt())
        if self.teacher is not None:
            history_rms = feature_rms(cache, cache.layer_index([ids[i] for i in (0, len(ids) // 2, len(ids) - 1)],
                                                               "dlite"), train_sequences)
            scale_fusion_init_(self.teacher.history_fc, history_rms)
        self.embed = target.embed_tokens
        self.read = SequenceReader(cache, ids, "dlite", self.device)
        # history fusion reads the first, middle and last of the CHS layers
        self.history_slots = [0, len(ids) // 2, len(ids) - 1]
        self.depth_ids = torch.tensor(ids, device=self.device)
        self.offsets = torch.arange(1, options.block_size, device=self.device)
        self.weights = losses.position_weights(options.block_size - 1, options.gamma, self.device)
        # sub: labels mapped into a sub-vocabulary. train_vocab_top: the training softmax over the rows of a
        # full-vocabulary head that the target ranks high (validation argmaxes over all rows: sub None); a draft
        # vocabulary: the head's own rows, in training and validation alike (`validating`: labels outside it
        # are misses there instead of dropped positions).
        self.reduced_head = vocab is not None
        self.validating = False
        self.train_sub = None
        if self.reduced_head:
            self.train_sub = SubVocabulary(vocab, target.vocab_size, self.device)
        elif options.train_vocab_top > 0:
            vocab = training_vocabulary(cache, train_sequences, options.train_vocab_top)
            self.train_sub = SubVocabulary(vocab, target.vocab_size, self.device)
        self.sub = self.train_sub

    # ---- forwards ----------------------------------------------------------------------------------------------
    def _queries(self, seq, anchors: torch.Tensor) -> torch.Tensor:
        B = self.options.block_size
        ids = torch.full((anchors.shape[0], B), self.settings.mask_token_id, device=self.device)
        ids[:, 0] = seq.tokens[anchors]
        return self.embed(ids).float()

    def _slots(self, model: DLiteModel, seq, anchors: torch.Tensor) -> torch.Tensor:
        pivot = seq.hidden[anchors - 1]  # [A, S, H]: CHS of the token before the anchor
        return model.context_norm(pivot + model.layer_depth_embedding(self.depth_ids))

    def student_logits(self, seq, anchors: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        m = self.student
        slots = self._slots(m, seq, anchors)
        A, S = slots.shape[0], slots.shape[1]
        positions = block_positions(1, self.options.block_size, S, self.device)
        out = block_layers(m, self._queries(seq, anchors), positions[S:].expand(A, -1), own=slots,
                           own_pos=positions[:S].expand(A, -1))
        return rnn_logits(m.sequential_head, out[:, 1:], prev, self._rows())

    def _rows(self):
        return self.sub.ids if self.sub is not None and not self.reduced_head else None

    def teacher_logits(self, seq, anchors: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        t = self.teacher
        W, B = self.options.history_window, self.options.block_size
        hist_pos = anchors[:, None] - W + torch.arange(W, device=self.device)[None]  # a-W … a-1
        last = int(anchors.max())
        fused = t.history_norm(t.history_fc(seq.hidden[:last, self.history_slots].flatten(1)))  # once per sequence
        history = fused[hist_pos.clamp(min=0)]  # [A, W, H]
        slots = self._slots(t.core, seq, anchors)
        A, S = slots.shape[0], slots.shape[1]
        own = torch.cat([history, slots], dim=1)
        own_pos = torch.cat([hist_pos.clamp(min=0), (anchors - 1)[:, None].expand(A, S)], dim=1)
        block_pos = anchors[:, None] + torch.arange(B, device=self.device)[None]
        out = block_layers(t.core, self._queries(seq, anchors), block_pos, own=own, own_pos=own_pos)
        return rnn_logits(t.core.sequential_head, out[:, 1:], prev, self._rows())

    def _per_sequence(self, batch: Batch):
        for seq_id, anchors in zip(batch.seqs, batch.anchors):
            seq = self.read(seq_id)
            anchors = torch.as_tensor(anchors, device=self.device)
            tgt = block_targets(seq, anchors, self.offsets)
            yield seq, anchors, tgt if self.sub is None else self.sub.targets(tgt, misses=self.validating)

    # ---- losses ------------------------------------------------------------------------------------------------
    def _mean_terms(self, batch: Batch, fn) -> dict[str, torch.Tensor]:
        totals: dict[str, torch.Tensor] = {}
        count = 0
        for seq, anchors, tgt in self._per_sequence(batch):
            terms = fn(seq, anchors, tgt, self.weights[None] * tgt["valid"])
            for key, value in terms.items():
                totals[key] = totals.get(key, 0.0) + value
            count += 1
        return {k: v / count for k, v in totals.items()}

    def teacher_loss(self, batch: Batch, fraction: float) -> dict[str, torch.Tensor]:
        def fn(seq, anchors, tgt, w):
            ce = losses.weighted_ce(self.teacher_logits(seq, anchors, tgt["prev"]), tgt["labels"], w)
            return {"loss": ce, "ce": ce}
        return self._mean_terms(batch, fn)

    def _kl(self, seq, anchors, tgt, w):
        with torch.no_grad():
            teacher = self.teacher_logits(seq, anchors, tgt["prev"])
        return losses.forward_kl(teacher, self.student_logits(seq, anchors, tgt["prev"]), w)

    def distill_loss(self, batch: Batch, fraction: float) -> dict[str, torch.Tensor]:
        def fn(seq, anchors, tgt, w):
            kl = self._kl(seq, anchors, tgt, w)
            return {"loss": kl, "kl": kl}
        return self._mean_terms(batch, fn)

    def align_loss(self, batch: Batch, fraction: float) -> dict[str, torch.Tensor]:
        o = self.options
        blend = 1.0
        if self.teacher is not None and o.blend_fraction > 0 and fraction < o.blend_fraction:
            blend = 0.5 - 0.5 * math.cos(math.pi * fraction / o.blend_fraction)  # 0 → 1, cosine

        def fn(seq, anchors, tgt, w):
            logits = self.student_logits(seq, anchors, tgt["prev"])
            ce = losses.weighted_ce(logits, tgt["labels"], w)
            tv = losses._weighted_mean(losses.tv_to_sparse_target(logits, tgt["topk_ids"], tgt["topk_probs"]), w)
            align = o.ce_weight * ce + o.tv_weight * tv
            terms = {"ce": ce, "tv": tv}
            if blend < 1.0:
                kl = self._kl(seq, anchors, tgt, w)
                terms["kl"] = kl
                align = (1.0 - blend) * kl + blend * align
            terms["loss"] = align
            return terms
        return self._mean_terms(batch, fn)

    # ---- recipe interface --------------------------------------------------------------------------------------
    def modules(self) -> dict[str, nn.Module]:
        return {"student": self.student, **({"teacher": self.teacher} if self.teacher is not None else {})}

    def stages(self, steps: int) -> list[Stage]:
        o = self.options
        batch = dict(batch_seqs=o.batch_seqs, anchors_per_seq=o.anchors_per_seq)
        if self.teacher is None:
            return [Stage("align", steps, o.lr, lambda: list(self.student.parameters()), self.align_loss, **batch)]
        teacher_steps = max(1, int(round(o.teacher_fraction * steps)))
        distill_steps = max(1, int(round(o.distill_fraction * steps)))
        align_steps = max(1, steps - teacher_steps - distill_steps)
        head = self.student.sequential_head

        def start_distill():
            head.load_state_dict(self.teacher.core.sequential_head.state_dict())
            head.requires_grad_(False)
            self.teacher.requires_grad_(False)

        def start_align():
            head.requires_grad_(True)
            self.teacher.requires_grad_(False)

        def student_params():
            return [p for p in self.student.parameters() if p.requires_grad]

        return [
            Stage("teacher", teacher_steps, o.teacher_lr, lambda: list(self.teacher.parameters()),
                  self.teacher_loss, **batch, on_start=lambda: self.teacher.requires_grad_(True)),
            Stage("distill", distill_steps, o.lr, student_params, self.distill_loss, **batch, on_start=start_distill),
            Stage("align", align_steps, o.lr, student_params, self.align_loss, **batch, on_start=start_align),
        ]

    def validate(self, batch: Batch) -> dict[str, float]:
        # the drafter argmaxes over all of its head's rows: the full vocabulary, or its draft vocabulary
        self.sub = self.train_sub if self.reduced_head else None
        self.validating = True
        try:
            return self._validate(batch)
        finally:
            self.sub = self.train_sub
            self.validating = False

    def _validate(self, batch: Batch) -> dict[str, float]:
        preds, labels, valid, t_preds = [], [], [], []
        for seq, anchors, tgt in self._per_sequence(batch):
            preds.append(self.student_logits(seq, anchors, tgt["prev"]).argmax(-1))
            if self.teacher is not None:
                t_preds.append(self.teacher_logits(seq, anchors, tgt["prev"]).argmax(-1))
            labels.append(tgt["labels"])
            valid.append(tgt["valid"])
        labels, valid = torch.cat(labels), torch.cat(valid)
        out = {"tau_student": chain_tau(torch.cat(preds), labels, valid),
               "acc1_student": float((torch.cat(preds)[:, 0] == labels[:, 0]).float().mean())}
        if t_preds:
            out["tau_teacher"] = chain_tau(torch.cat(t_preds), labels, valid)
        return out

    def export(self, out_dir: Path) -> dict:
        s = self.settings
        config = dict(self.layer_config)
        config.update(
            architectures=["DLiteDraftModel"], model_type="qwen3", block_size=s.block_size,
            num_target_layers=s.num_target_layers,
            dlite_config={"architecture_version": s.architecture_version, "model_role": "pivot_q_student",
                          "anchor_group_size": s.anchor_group_size, "chs_num_layers": len(s.target_layer_ids),
                          "target_layer_ids": list(s.target_layer_ids), "sequential_head": "rnn",
                          "sequential_rank": s.sequential_rank, "mask_token_id": s.mask_token_id,
                          **({"draft_vocab_size": s.draft_vocab_size} if s.draft_vocab_size else {})},
        )
        save_checkpoint(out_dir, config, self.student.state_dict())
        return config

    def released_module(self):
        return self.student, ()

    def load_init(self, directory: Path) -> dict:
        if self.teacher is not None:
            raise UserError("--init warm-starts the DLite student only, and the two-stage recipe would replace its "
                            "head with a new teacher's: add --set single_stage=true")
        info = super().load_init(directory, () if self.options.init_head else ("sequential_head.",))
        head = self.student.sequential_head
        if head.reduced and self.options.init_head:  # the warm start brings its own draft vocabulary: labels follow
            head.refresh_vocabulary()
            self.train_sub = self.sub = SubVocabulary(head.target_ids(), self.target.vocab_size, self.device)
        return info

    def describe(self) -> dict:
        return {"options": asdict(self.options), "student_parameters": param_count(self.student),
                "training_vocabulary": int(self.train_sub.ids.numel()) if self.train_sub else self.target.vocab_size,
                "draft_vocabulary": self.settings.draft_vocab_size or self.target.vocab_size,
                "teacher_parameters": param_count(self.teacher) if self.teacher is not None else 0,
                "target_layer_ids": list(self.settings.target_layer_ids), "mask_token": self.mask_how,
                "head_warm_start": self.head_fit,
                "embed_tokens": "target (frozen, not stored)",
                "lm_head": "own rank-R RNN head" + (" over its draft vocabulary (d2t)" if self.reduced_head else "")}
