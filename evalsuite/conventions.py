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
POSITION = ("position j: conditional = P(j accepted | positions 1..j-1 accepted), marginal = P(positions 1..j all "
            "accepted); both count only steps that drafted at least j tokens (a position that was not drafted is not "
            "a rejection)")
CONTEXT = "context_len = the target's KV length when a step starts; a turn's context_len = its prompt length"

CONTENDED_CORES = 0.5  # a decode is *contended* when other processes kept at least this many cores busy on average
CONTENDED = (f"contended = other processes kept >= {CONTENDED_CORES:g} cores busy on average while the decode ran "
             "(all CPU time in /proc/stat minus this process's own): its timings are not an idle machine's")

# What run.json records under "conventions".
RUN_CONVENTIONS = {"tau": TAU, "speedup": SPEEDUP, "per_position": POSITION, "context_len": CONTEXT,
                   "contended": CONTENDED}
