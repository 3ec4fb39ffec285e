"""The decode loop: draft k → verify once → accept the longest agreeing prefix plus a bonus token → roll back.

`decode_turn` is gpt-fast's `generate` loop around `speculative_decode`, with a `Method` in the draft model's
place and our own cache and clock. After the target's prefill (the caller's, timed apart), the first token comes
from the prefill's logits and the method gets the context (`start_turn`). Then each verify step:

- draft: `method.propose(room)` gives up to k tokens (and, for sampling, their draft probabilities), where room
  is k cut to what the token budget and the window leave; with no room the step is a plain one-token `ar` step
  (`budget_limited`, left out of τ). gpt-fast's `decode_n_tokens(draft_model, …, speculate_k)`;
- verify: one target forward over [anchor, d1 … dk] from the cached KV (gpt-fast's `model_forward` at
  input_pos … input_pos + k), returning logits for k + 1 positions and, for learned methods, the hidden states of
  the layers they read;
- accept: at temperature 0 the longest prefix of drafts equal to the target's argmax, then the target's own next
  token as the bonus (`accept_greedy`); otherwise gpt-fast's rule, each draft kept with probability
  min(1, p_target / p_draft) (p_draft one-hot for a drafter without probabilities), the first rejection resampled
  from the normalised max(p_target − p_draft, 0), or, when all k survive, a bonus sampled from the last position
  (`accept_rejection`). Either way the step emits accepted + 1 tokens;
- roll back: the KV cache is cropped to the anchor plus the accepted drafts (gpt-fast rewinds input_pos
  instead), and `method.commit` hands the drafter the emitted tokens with their target features, so its own
  state follows the output (gpt-fast feeds the last draft back into the draft model when all were accepted).

The loop stops at an EOS (an EOS among accepted drafts ends the output there; drafts after it are not counted),
at `max_new_tokens`, or at the target's window (`context_limit`). Every interval is a `timing.DeviceClock` mark,
read once the turn is over: per step the drafter's work (propose + commit), the verify forward alone, and the
whole step; the turn's decode time includes the drafter's start-of-turn work. `Step` rows record the context
length, drafted and accepted counts, emitted tokens and the drafter's memory after each step.
"""

from __future__ import annotations

from typing import Callable

import torch

from evalsuite.engines.acceptance import accept_greedy, accept_rejection, sample_from, target_probs
from evalsuite.methods.base import Method, Proposal, Sampling
from evalsuite.store.records import Step, TurnResult
from evalsuite.target.model import TargetModel
from evalsuite.timing import DeviceClock


def first_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """The token the prefill itself produces (not part of any verify step)."""
    if sampling.greedy:
        return int(logits[-1].argmax())
    return sample_from(target_probs(logits[-1:], sampling)[0].cpu(), generator)


def decode_turn(
    target: TargetModel,
    method: Method,
    cache,
    context_ids: torch.Tensor,
    context_features: torch.Tensor | None,
    prefill_logits: torch.Tensor,
    k: int,
    sampling: Sampling,
    max_new_tokens: int,
    generator: torch.Generator | None,
    clock: DeviceClock,
    on_step: Callable[[int], None] | None = None,
) -> TurnResult:
    """Decode one assistant turn after the target has prefilled `context_ids` into `cache`.

    The cache is left longer than the context; the caller crops it back. `on_step(emitted)` is called between
    steps, outside their timed intervals (a progress bar)."""
    stop_ids = target.stop_ids
    layers = method.feature_layers
    context_len = context_ids.numel()
    token_limit = min(max_new_tokens, target.max_context - context_len)

    no_drafts = context_ids.new_empty(0)
    cache.reserve(context_len + token_limit + k + 1)  # untimed: no verify step pays for cache growth
    t0 = clock.mark()
    anchor = first_token(prefill_logits, sampling, generator)
    out = [anchor]
    method.start_turn(torch.cat([context_ids, context_ids.new_tensor([anchor])]), context_features)
    started = clock.mark()
    result = TurnResult(output_ids=out)
    marks = []  # per step: (start, draft end, verify end, commit start, commit end, end), read after the turn
    if anchor in stop_ids:
        result.stop_reason = "eos"

    while result.stop_reason == "max_new_tokens" and len(out) < token_limit:
        step_start = clock.mark()
        room = max(min(k, token_limit - len(out) - 1, target.max_context - (context_len + len(out)) - 1), 0)
        # with no room left (last token of the budget) the step is a plain AR step; methods never see k=0
        proposal = method.propose(room, sampling, generator) if room else Proposal(no_drafts)
        drafts = proposal.tokens[:room]
        draft_end = clock.mark()

        block = torch.cat([drafts.new_tensor([anchor]), drafts])
        verified = target.forward(block, cache, layers)
        verify_end = clock.mark()
        if sampling.greedy:
            accepted, bonus = accept_greedy(drafts, verified.logits)
        else:
            probs = proposal.probs[: drafts.numel()] if proposal.probs is not None else None
            accepted, bonus = accept_rejection(drafts, probs, verified.logits, sampling, generator)
        kv_len = context_len + len(out) - 1  # KV length before this step: everything but the anchor
        cache.crop_to(kv_len + 1 + accepted)  # keep the anchor and the accepted drafts
        new_ids = drafts[:accepted].tolist() + [bonus]
        commit_start = clock.mark()
        method.commit(block.new_tensor(new_ids), None if verified.hidden is None else verified.hidden[: accepted + 1])
        commit_end = clock.mark()

        emitted = 0
        for token in new_ids:
            out.append(token)
            emitted += 1
            if token in stop_ids:
                result.stop_reason = "eos"
                break
        counted = min(accepted, emitted)  # drafts accepted after an accepted EOS draft are not counted
        anchor = out[-1]
        state = method.state_bytes()
        marks.append((step_start, draft_end, verify_end, commit_start, commit_end, clock.mark()))
        if on_step is not None:
            on_step(emitted)
        result.steps.append(Step(
            context_len=kv_len, num_drafted=drafts.numel(), num_accepted=counted, emitted=emitted,
            draft_s=0.0, verify_s=0.0, step_s=0.0, draft_state_bytes=state.total, draft_history_bytes=state.history,
            budget_limited=room == 0,
        ))

    if result.stop_reason == "max_new_tokens" and len(out) >= token_limit and token_limit < max_new_tokens:
        result.stop_reason = "context_limit"
    end = clock.mark()
    # Intervals are read once the turn is over (on CUDA: device events, no synchronisation per step). draft_s is
    # all drafter work (propose + commit); verify_s is the target forward alone; the rest of step_s (acceptance,
    # cache rollback, bookkeeping) is the engine's own overhead.
    result.decode_s = clock.seconds(t0, end)
    result.draft_prefill_s = clock.seconds(t0, started)
    for step, (start, drafted, verified_at, commit_start, commit_end, stop) in zip(result.steps, marks):
        step.draft_s = clock.seconds(start, drafted) + clock.seconds(commit_start, commit_end)
        step.verify_s = clock.seconds(drafted, verified_at)
        step.step_s = clock.seconds(start, stop)
    return result
