"""Target distributions and the acceptance rule (exact match at T=0, rejection sampling at T>0)."""

from __future__ import annotations

import torch

from evalsuite.methods.base import Sampling


def target_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """[n, V] logits → [n, V] probabilities at the sampling temperature, with top-k / top-p filtering."""
    scaled = logits.float() / sampling.temperature
    if sampling.top_k > 0:
        kth = torch.topk(scaled, min(sampling.top_k, scaled.shape[-1]), dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True, dim=-1)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative - torch.softmax(sorted_logits, dim=-1) >= sampling.top_p  # keep the first over top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return torch.softmax(scaled, dim=-1)


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def accept_greedy(drafts: torch.Tensor, logits: torch.Tensor) -> tuple[int, int]:
    """Greedy acceptance. drafts [k]; logits [k+1, V] of the target at the anchor and each draft.

    Returns (accepted, bonus): the longest prefix of drafts equal to the target argmax, and the target's
    argmax at the first mismatch (or after the last draft)."""
    choices = logits.argmax(dim=-1)
    k = drafts.numel()
    matches = (drafts == choices[:k]).int()
    accepted = int(matches.cumprod(dim=0).sum()) if k else 0
    return accepted, int(choices[accepted])


def accept_rejection(
    drafts: torch.Tensor,
    draft_probs: torch.Tensor | None,
    logits: torch.Tensor,
    sampling: Sampling,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Standard speculative rejection sampling (Leviathan et al. / Chen et al.), lossless in distribution.

    Draft token i is kept with probability min(1, p_i(x)/q_i(x)); at the first rejection the replacement is
    drawn from normalize(max(p_i - q_i, 0)); if all k are kept the bonus is drawn from p_k.
    `draft_probs` None means each draft was chosen deterministically (q one-hot)."""
    p = target_probs(logits, sampling)  # [k+1, V]
    k = drafts.numel()
    if k:
        if draft_probs is None:
            q = torch.zeros(k, p.shape[-1], device=p.device)
            q.scatter_(1, drafts.view(-1, 1), 1.0)
        else:
            q = draft_probs.float()
        rows = torch.arange(k, device=p.device)
        ratio = p[rows, drafts] / q[rows, drafts].clamp_min(1e-20)
        uniform = torch.rand(k, generator=generator, device="cpu").to(p.device)
        kept = (uniform < ratio).int().cumprod(dim=0)
        accepted = int(kept.sum())
        if accepted < k:
            residual = (p[accepted] - q[accepted]).clamp_min(0.0)
            total = residual.sum()
            # residual is all-zero only when p == q there, where rejection has probability 0; guard anyway
            residual = residual / total if total > 0 else p[accepted]
            return accepted, sample_from(residual.cpu(), generator)
    else:
        accepted = 0
    return accepted, sample_from(p[accepted].cpu(), generator)
