"""The names and definitions every layer shares: the baseline method, the skip marker, and the one wording of
each measurement convention (printed under tables, written to run.json, shown by the CLI).

This module imports nothing: every other module may import it.
"""

BASELINE = "ar"  # the method every speedup is paired with: the target alone, one token per forward
SKIPPED = "skipped"  # stop_reason of a turn that was not decoded (its skip_reason says why)

TAU = ("τ = pooled ratio over verify steps: sum of (accepted drafts + 1) / number of steps, bonus included "
       "(steps that drafted nothing count as 1, except those the token budget left no room to draft, which are "
       "excluded; drafts accepted after an EOS are not counted)")
TAU_TURN_MACRO = "τ (turn macro) = the unweighted mean of per-turn τ"
SPEEDUP = ("speedup = paired AR decode time per token / method decode time per token, each pooled over all paired "
           "turns (sum of seconds / sum of tokens); decode excludes the target prefill and includes the drafter's "
           "start-of-turn work; speedup_turn is the same ratio for one turn")
POSITION = ("position j: marginal = P(draft positions 1..j all accepted) over every verify step whose token budget "
            "left room for j drafts (room = min(K, tokens left - 1)): a drafter that proposed fewer than j tokens "
            "there counts as not accepted at j, a position the budget forbade is not counted, steps with no room "
            "(`budget_limited`) are excluded; conditional = P(j accepted | 1..j-1 accepted) over the same steps; "
            "for a variable-length drafter also the mean drafted length per step and the acceptance per drafted "
            "token (sum of accepted / sum of drafted)")
CONTEXT = "context_len = the target's KV length when a step starts; a turn's context_len = its prompt length"

CONTENDED_CORES = 0.5  # a decode is *contended* when other processes kept at least this many cores busy on average
CONTENDED = (f"contended = other processes kept >= {CONTENDED_CORES:g} cores busy on average while the decode ran "
             "(all CPU time in /proc/stat minus this process's own): its timings are not an idle machine's; "
             "cpu_others is NaN (unknown, not contended) where the decode was too short for /proc/stat's 10 ms "
             "ticks to tell (under 80 ms on 2 cores)")

# A degenerate turn: the target repeats its context or loops, so a model-free drafter copies it for free and the
# turn's speed says little about drafting. `evalsuite.degenerate` flags it with these thresholds.
DEGENERATE_COPY_MIN_TOKENS = 32  # an exact copy of at least this many tokens of an earlier reply of the trajectory
DEGENERATE_LOOP_MAX_PERIOD = 16  # or a pattern of 1..this many tokens repeated back to back
DEGENERATE_LOOP_MIN_REPEATS = 3  # at least this many times
DEGENERATE_LOOP_MIN_TOKENS = 24  # over at least this many tokens
DEGENERATE = (f"degenerate turn: the reply contains an exact copy of at least {DEGENERATE_COPY_MIN_TOKENS} tokens of "
              "an earlier reply of the same method in the same trajectory, or loops (a pattern of 1 to "
              f"{DEGENERATE_LOOP_MAX_PERIOD} tokens repeated back to back at least {DEGENERATE_LOOP_MIN_REPEATS} "
              f"times over at least {DEGENERATE_LOOP_MIN_TOKENS} tokens)")

# What run.json records under "conventions".
RUN_CONVENTIONS = {"tau": TAU, "speedup": SPEEDUP, "per_position": POSITION, "context_len": CONTEXT,
                   "contended": CONTENDED, "degenerate": DEGENERATE}
