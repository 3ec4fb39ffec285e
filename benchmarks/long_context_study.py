"""How far each bundled SWE-Bench trajectory's logged context reaches with a target's tokenizer, to pick the
trajectories of the long-context study (benchmarks/long_context_study.sh).

    python benchmarks/long_context_study.py --target qwen2.5-coder-0.5b --list [--subset mini-swe-agent-long]
    python benchmarks/long_context_study.py --subset mini-swe-agent-long --min-tokens 20000 --count 12

The context of each turn is rendered through the target's chat template exactly as a logged-replay run renders it
(the replay module, the target's window and `--max-new-tokens 64`), so "reaches" is the longest turn a run could
decode. `--count N` prints N sample ids, comma-separated, that reach `--min-tokens`, one per repository first.
"""

from __future__ import annotations

import argparse

from evalsuite.replay import LoggedReplay, Window, make_policy
from evalsuite.target.model import load_chat
from evalsuite.tasks.base import LoadOptions, get_task


def reach(target: str, new_tokens: int = 64, k: int = 7, subset: str | None = None) -> list[tuple[str, int, int, str]]:
    """(sample id, turns, tokens of the longest context a run decodes, repository) per bundled trajectory of the
    swebench `subset` (None: the default one)."""
    chat = load_chat(target)
    policy = make_policy("stop", Window(chat.max_context, new_tokens, k))
    found = []
    for trajectory in get_task("swebench").load(LoadOptions(subset=subset)):
        replay = LoggedReplay(trajectory, policy,
                              lambda messages, tools=trajectory.tools: chat.render(messages, tools))
        longest, turn = 0, 0
        while replay.has_turn(turn):
            context = replay.context(turn)
            if not context.skipped:
                longest = max(longest, context.context_len)
            replay.record_reply(turn, None if context.skipped else "")
            turn += 1
        found.append((trajectory.sample_id, turn, longest, str(trajectory.meta.get("repo") or "")))
    return found


def pick(rows: list[tuple[str, int, int, str]], min_tokens: int, count: int) -> list[str]:
    """`count` ids reaching `min_tokens`, the longest of each repository first, then the rest by reach."""
    eligible = sorted((r for r in rows if r[2] >= min_tokens), key=lambda r: -r[2])
    chosen, repos = [], set()
    for row in eligible:
        if row[3] not in repos:
            chosen.append(row[0])
            repos.add(row[3])
    chosen += [r[0] for r in eligible if r[0] not in chosen]
    return chosen[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-0.5b")
    parser.add_argument("--min-tokens", type=int, default=20000)
    parser.add_argument("--count", type=int, default=5)
    parser.add_argument("--subset", default=None, help="a swebench trajectory subset (default: the default one)")
    parser.add_argument("--list", action="store_true", help="print every trajectory's reach")
    args = parser.parse_args()
    rows = reach(args.target, subset=args.subset)
    if args.list:
        for sample, turns, longest, repo in sorted(rows, key=lambda r: -r[2]):
            print(f"{sample}\t{turns} turns\t{longest:,} tokens\t{repo}")
        return
    print(",".join(pick(rows, args.min_tokens, args.count)))


if __name__ == "__main__":
    main()
