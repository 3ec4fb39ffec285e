"""Training losses shared by the drafter recipes.

Shapes: logits are [..., V]; `weights` broadcast against the leading dims (position weights times a validity
mask). Every weighted loss is a weighted mean: sum(w * loss) / sum(w), and 0 when all weights are 0.

- Position weights `w_k = exp(-(k-1)/γ)` for draft position k = 1..K (DFlash, DLite; DSpark's code writes the
  same thing 0-based as exp(-k/γ), k = 0..K-1).
- `total_variation(p, q) = ½‖p − q‖₁`, so `1 − TV` is the probability that a token drawn from q is accepted
  against p by rejection sampling. DSpark's released loss uses the un-halved ‖p − q‖₁ (its "l1" term, weight
  0.9) and the confidence label 1 − ½‖p − q‖₁; `dspark_loss` reproduces exactly that.
- `forward_kl(teacher, student) = KL(p_teacher ‖ p_student)`: the usual distillation direction.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from evalsuite import metrics


def position_weights(block: int, gamma: float, device=None) -> torch.Tensor:
    """[block] weights exp(-(k-1)/γ) for k = 1..block; γ <= 0 means uniform weights."""
    k = torch.arange(block, dtype=torch.float32, device=device)
    if gamma <= 0:
        return torch.ones_like(k)
    return torch.exp(-k / gamma)


def _weighted_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    weights = weights.to(values.dtype).expand_as(values)
    total = weights.sum()
    if total <= 0:
        return values.sum() * 0.0  # keeps the graph (and a zero gradient) when nothing is valid
    return (values * weights).sum() / total


def weighted_ce(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of `labels` [...] under `logits` [..., V], weighted mean over the leading dims."""
    per = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), reduction="none")
    return _weighted_mean(per.view(labels.shape), weights)


def forward_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """KL(p_teacher ‖ p_student), weighted mean over the leading dims; the teacher gets no gradient."""
    log_p = F.log_softmax(teacher_logits.detach().float(), dim=-1)
    log_q = F.log_softmax(student_logits.float(), dim=-1)
    per = (log_p.exp() * (log_p - log_q)).sum(-1)
    return _weighted_mean(per, weights)


def total_variation(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """½‖p − q‖₁ over the last dim, per position."""
    return 0.5 * (p - q).abs().sum(-1)


def confidence_bce(confidence_logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """BCE-with-logits of a predicted acceptance probability against a soft label in [0, 1]."""
    per = F.binary_cross_entropy_with_logits(confidence_logits.float(), labels.detach().float(), reduction="none")
    return _weighted_mean(per, weights)


def tv_to_sparse_target(draft_logits: torch.Tensor, target_ids: torch.Tensor,
                        target_probs: torch.Tensor) -> torch.Tensor:
    """½‖p − q‖₁ per position, p = the target's top-K distribution (renormalised; 0 elsewhere), q = softmax of
    the full draft logits: ½(Σ_topK |p_i − q_i| + (1 − Σ_topK q_i))."""
    q = torch.softmax(draft_logits.float(), dim=-1)
    q_top = q.gather(-1, target_ids.long())
    p = target_probs.float() / target_probs.float().sum(-1, keepdim=True).clamp_min(1e-12)
    return 0.5 * ((p - q_top).abs().sum(-1) + (1.0 - q_top.sum(-1)).clamp_min(0.0))


def sparse_soft_ce(draft_logits: torch.Tensor, target_ids: torch.Tensor, target_probs: torch.Tensor,
                   weights: torch.Tensor) -> torch.Tensor:
    """-Σ p_i log q_i over the target's top-K (renormalised): EAGLE-3's loss with a truncated target."""
    log_q = F.log_softmax(draft_logits.float(), dim=-1).gather(-1, target_ids.long())
    p = target_probs.float() / target_probs.float().sum(-1, keepdim=True).clamp_min(1e-12)
    return _weighted_mean(-(p * log_q).sum(-1), weights)


def dspark_loss(draft_logits: torch.Tensor, confidence_logits: torch.Tensor | None, tv: torch.Tensor,
                labels: torch.Tensor, weights: torch.Tensor, ce_weight: float = 0.1, l1_weight: float = 0.9,
                confidence_weight: float = 1.0) -> dict[str, torch.Tensor]:
    """DSpark: ce·CE + l1·‖p_d − p_t‖₁ + conf·BCE(c, 1 − ½‖p_d − p_t‖₁), all position-weighted.

    `tv` is ½‖p_d − p_t‖₁ per position (dense `total_variation` or `tv_to_sparse_target`)."""
    terms = {"ce": weighted_ce(draft_logits, labels, weights), "l1": _weighted_mean(2.0 * tv, weights)}
    loss = ce_weight * terms["ce"] + l1_weight * terms["l1"]
    if confidence_logits is not None:
        terms["bce"] = confidence_bce(confidence_logits, (1.0 - tv).clamp(0.0, 1.0), weights)
        loss = loss + confidence_weight * terms["bce"]
    terms["loss"] = loss
    return terms


def greedy_tau(correct: torch.Tensor, valid: torch.Tensor) -> float:
    """Expected accepted length at T=0 (bonus included) from per-position hits [N, K] of a chain draft."""
    hits = (correct & valid).float().cumprod(-1).sum(-1)
    starts = valid[:, 0]
    if not bool(starts.any()):
        return math.nan
    return metrics.tau_of(hits[starts].tolist())
