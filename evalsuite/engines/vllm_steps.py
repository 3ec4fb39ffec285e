"""Rebuild per-verify-step rows from vLLM's per-request speculative-decoding metrics (pure Python).

vLLM reports, per request, `per_step_accepted` / `per_step_drafted` for the verify steps that drafted at
least one token only (an n-gram step that finds no match is a plain decode step and is not counted). The
output ids, the prompt length and a `would_draft(emitted)` oracle (vLLM's own proposer for ngram; always
true for model drafters) put those steps back in order and re-insert the zero-draft steps, so every row
gets its context length. Conventions are the HF engine's: the first output token comes from the prefill
and is no step; a step's `context_len` is the KV length when it starts (prompt + tokens emitted − 1,
since the newest token is fed in the step itself); `emitted` is accepted + bonus, less any cut at the end.

This module must stay importable without torch: the vLLM worker imports it in vLLM's own venv.
"""

from __future__ import annotations

from typing import Callable


def rebuild_steps(prompt_len: int, num_output: int, accepted: list[int], drafted: list[int],
                  would_draft: Callable[[int], bool] | None = None) -> tuple[list[dict], bool]:
    """Returns (steps, exact). Each step: context_len, num_drafted, num_accepted, emitted.

    `exact` is False when the reported steps do not tile the output (then the rows still hold every
    reported step in order, with zero-draft steps placed where the oracle could not place them)."""
    if len(accepted) != len(drafted):
        raise ValueError("per_step_accepted and per_step_drafted differ in length")
    steps: list[dict] = []
    pos, i = 1, 0  # tokens emitted so far (the prefill gave the first), next reported step
    while pos < num_output:
        drafts_here = i < len(accepted) and (would_draft is None or would_draft(pos))
        if drafts_here:
            d, a = int(drafted[i]), int(accepted[i])
            i += 1
        else:
            d, a = 0, 0
        emitted = min(a + 1, num_output - pos)
        steps.append({"context_len": prompt_len + pos - 1, "num_drafted": d, "num_accepted": a, "emitted": emitted})
        pos += emitted
    exact = i == len(accepted)
    for j in range(i, len(accepted)):  # reported steps the walk did not reach: keep them, flagged inexact
        steps.append({"context_len": prompt_len + pos - 1, "num_drafted": int(drafted[j]),
                      "num_accepted": int(accepted[j]), "emitted": 0})
    return steps, exact
