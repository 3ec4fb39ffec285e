"""Math word problems written by the target itself, as training prompts for its drafters (self-instruct).

Why: every drafter of the 32k target must reach GSM8K tau >= 2.0 held out (issue #31), and ShareGPT holds only
about 640 math-like first turns. A drafter learns the target's replies, so what it needs is more of the target's
own step-by-step arithmetic; the prompts only have to look like grade-school word problems. No benchmark text
is used to write them: the instruction names a topic, a character, the operations and a number of steps drawn
at random from the lists below, and the target samples (T=0.9, top-p 0.95) one problem per instruction.

Each kept problem is one JSONL record {"id", "prompt", "spec"} (the chat-source format of `evalsuite train
--data NAME:PATH`). The training selection then checks it against the held-out list of every evaluation task
(GSM8K's test split included: a target that recalls a test problem word for word is dropped there) and the
target answers it greedily like every other prompt. Kept: a problem of 15-120 words with a digit and a
question mark, cut before any solution, not a duplicate. Resumable: records already in OUT are kept and
OUT.progress.json holds the draws done (without it, every batch up to the last kept draw counts as done), so a
rerun continues the seeded draw where it stopped (an interrupted batch is drawn again with the same seed, hence
the same problems as an uninterrupted run, at the same --batch).
A target that seldom writes a usable problem stops at --max-draws (default 6 x --count) with a one-line message.

Usage: python benchmarks/synth_math_prompts.py OUT.jsonl [--count 600] [--target qwen2.5-coder-0.5b]
                                                  [--batch 48] [--seed 0] [--threads 2] [--max-draws N]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path

TOPICS = [
    "a bakery selling cupcakes and loaves", "a school field trip", "saving pocket money", "a bookstore sale",
    "a vegetable garden", "a farmer's eggs and chickens", "a road trip and fuel", "a lemonade stand",
    "a soccer season's goals", "a library's books", "painting a fence", "a pizza party", "a fish tank",
    "a marathon training plan", "a toy factory", "a grocery bill", "a birthday party's balloons",
    "a car wash fundraiser", "a zoo's animal food", "knitting scarves", "a bike shop's repairs",
    "an apple orchard", "a movie theater's tickets", "a summer job's wages", "a recipe scaled for guests",
    "a concert's seats", "a swimming pool filling up", "a train's travel time", "a phone plan's monthly cost",
    "collecting stamps", "a classroom's pencils and notebooks", "a bake sale's profit", "a dog walker's schedule",
    "a hotel's rooms", "a charity run's donations", "a candle shop", "planting trees in a park",
    "a restaurant's tips", "sharing candies among friends", "a board game tournament", "a sewing project's fabric",
    "a cafe's coffee orders", "a science fair's budget", "a flower shop's bouquets", "a water bottle refill station",
    "a music teacher's lessons", "a used-car payment plan", "a camping trip's supplies", "a video game's points",
    "a bus route's passengers",
]
NAMES = [
    "Maya", "Liam", "Sofia", "Noah", "Aisha", "Mateo", "Chen", "Olivia", "Ravi", "Emma", "Kofi", "Hana", "Lucas",
    "Zara", "Diego", "Nora", "Yusuf", "Grace", "Ivan", "Leila", "Tom", "Priya", "Ben", "Mei", "Carlos", "Ada",
]
OPERATIONS = [
    "addition and subtraction", "multiplication", "division with a whole-number answer", "fractions",
    "percentages", "money with dollars and cents", "rates (units per hour)", "ratios",
    "multiplication and subtraction", "averages", "time in hours and minutes", "discounts and tax",
]
INSTRUCTION = ("Write one new math word problem for a grade-school student about {topic}, with a character named "
               "{name}. Solving it must take {steps} steps and use {ops}. Use specific numbers. End with a single "
               "question. Write only the problem, not the answer or the solution.")
_LEAD = re.compile(r"^\s*(\*\*)?\s*(problem|question|word problem|math problem)\s*(\d+)?\s*[:.]\s*(\*\*)?\s*", re.I)
_STOP = re.compile(r"\n\s*\n|\n\s*(\*\*)?\s*(solution|answer|step 1|to solve|let's|steps?)\b", re.I)


def instructions(seed: int):
    """An endless seeded stream of (spec, instruction text)."""
    rng = random.Random(seed)
    while True:
        spec = {"topic": rng.choice(TOPICS), "name": rng.choice(NAMES), "ops": rng.choice(OPERATIONS),
                "steps": rng.randint(2, 5)}
        yield spec, INSTRUCTION.format(**spec)


def clean(text: str) -> str | None:
    """The problem in a sampled reply, or None when it is not one (see the module docstring)."""
    text = _LEAD.sub("", text.strip())
    text = _STOP.split(text, maxsplit=1)[0].strip().strip("*\"'").strip()
    if "?" not in text:
        return None
    text = text[: text.rindex("?") + 1]  # the question ends the problem
    words = len(text.split())
    if not 15 <= words <= 120 or not re.search(r"\d", text) or "```" in text:
        return None
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--count", type=int, default=600)
    parser.add_argument("--target", default="qwen2.5-coder-0.5b")
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--max-new-tokens", type=int, default=112)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-draws", type=int, default=0, help="give up after this many draws (0: 6 x --count)")
    args = parser.parse_args(argv)
    max_draws = args.max_draws or 6 * args.count

    import torch

    from evalsuite.target.model import TargetModel

    torch.set_num_threads(args.threads)
    kept: list[dict] = []
    if args.out.exists():
        kept = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]
    progress = args.out.with_name(args.out.name + ".progress.json")
    if progress.exists():
        state = json.loads(progress.read_text())
    else:  # e.g. a fresh checkout's copy of the committed problems: every batch up to the last kept draw was done
        done = (max([r["draw"] for r in kept], default=-1) // args.batch + 1) * args.batch
        state = {"drawn": done, "rejected": done - len(kept)}
    drawn, rejected = state["drawn"], state["rejected"]
    seen = {" ".join(r["prompt"].lower().split()) for r in kept}
    if len(kept) >= args.count:
        print(f"{args.out}: {len(kept)} problems already (>= --count {args.count})")
        return 0
    target = TargetModel.load(args.target)
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    stream = instructions(args.seed)
    for _ in range(drawn):
        next(stream)
    t0 = time.time()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as fh:
        while len(kept) < args.count:
            if drawn >= max_draws:
                print(f"{args.out}: stopped after {drawn} draws (--max-draws) with {len(kept)} of {args.count} "
                      "problems kept: this target seldom writes a usable word problem", file=sys.stderr)
                return 1
            batch = [next(stream) for _ in range(args.batch)]
            rows = [target.render([{"role": "user", "content": text}]) for _, text in batch]
            width = max(len(r) for r in rows)
            ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=target.device)
            mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=target.device)
            torch.manual_seed(args.seed * 1_000_003 + drawn)  # the same problems on a rerun from this draw
            with torch.inference_mode():
                out = target.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.9,
                                            top_p=0.95, max_new_tokens=args.max_new_tokens, pad_token_id=pad,
                                            eos_token_id=sorted(target.stop_ids) or None)
            for i, ((spec, _), row) in enumerate(zip(batch, out[:, width:].tolist())):
                problem = clean(tok.decode(row, skip_special_tokens=True))
                key = " ".join(problem.lower().split()) if problem else ""
                if not problem or key in seen:
                    rejected += 1
                    continue
                seen.add(key)
                kept.append({"id": f"synth-math-{drawn + i}", "draw": drawn + i, "prompt": problem, "spec": spec})
                fh.write(json.dumps(kept[-1]) + "\n")
            fh.flush()
            drawn += len(batch)
            progress.write_text(json.dumps({"drawn": drawn, "rejected": rejected}))
            print(f"[{time.strftime('%H:%M:%S')}] {len(kept)}/{args.count} kept, {rejected} rejected, "
                  f"{drawn} drawn, {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
