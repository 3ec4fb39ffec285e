"""The plans of benchmarks/bfcl_closed_qwen.sh's four runs, as `evalsuite run` prints them, without decoding.

    python benchmarks/bfcl_closed_plan.py --n 10 --new-tokens 256 --repeats 1

Each run's configuration is loaded as the runner loads it (target, methods, data), warmed up and its costs measured,
then `evalsuite.run.plan.make_plan` prints what `evalsuite run` would print before decoding; nothing is written but each
run's run.json under a temporary directory. A closed loop's plan counts one decode per user turn (replies not yet
written call no tool): a lower bound, as the plan itself says; benchmarks/results/bfcl_closed/README.md gives the
decodes per user turn a trial found.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from evalsuite.config import RunConfig
from evalsuite.run.plan import make_plan
from evalsuite.run.runner import Runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-0.5b")
    parser.add_argument("--methods", default="ar,ngram,suffix,dlite,eagle3,dflash,dspark")  # bfcl_closed_qwen.sh's
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", default="auto")
    parser.add_argument("--max-turns", type=int, default=None)
    args = parser.parse_args()
    total = 0.0
    with tempfile.TemporaryDirectory() as scratch:
        for subset in ("base", "long_context"):
            for replay in ("closed", "logged"):
                out = Path(scratch) / f"{replay}-{subset}"
                config = RunConfig(methods=args.methods.split(","), task="bfcl-v3", target=args.target,
                                   subset=subset, replay=replay, limit=args.n, seed=args.seed,
                                   max_new_tokens=args.new_tokens, repeats=args.repeats, threads=args.threads,
                                   max_turns=args.max_turns, out=str(out))
                runner = Runner(config, out)
                try:
                    runner.load()
                    plan = make_plan(runner, runner.warm_up())
                finally:
                    runner.engine.close()
                total += plan.estimate_s or 0.0
                print(f"{replay}-{subset}: {plan.describe()}", flush=True)
    print(f"all four runs: at least {total / 60:.0f} min by these plans (closed loops: one decode per user turn)")


if __name__ == "__main__":
    main()
