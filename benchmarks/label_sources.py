"""Which training labels pay more per CPU-hour on agent contexts: the target's regenerated replies, or the target's
predictions over the logged (agent-written) replies?

Both label sources give the drafter the target's own greedy tokens, but differently:
- regenerated: the target writes its reply itself (batched `generate`, as `evalsuite train` does). Every reply
  position is an anchor whose next K tokens are all known target tokens: a full-depth training chain.
- logged: one teacher-forced forward over context + the logged reply gives the target's greedy prediction at
  every reply position for the cost of a prefill. But the tokens fed in are the agent's (another model's), so a
  K-token chain from an anchor is the target's own continuation only as long as the target agrees with the logged
  text (a disagreement makes every later position condition on a token the target would not have written).

Measured here, in one run on the same contexts (SWE-agent training trajectories, held-out-checked, as
`evalsuite train` cuts them): CPU seconds per source, label positions, the target's top-1 agreement with the logged
text, the usable chain depth per anchor (consecutive agreements, capped at K), and full-depth chains per CPU-second.

Usage: python benchmarks/label_sources.py [--contexts 24] [--k 7] [--max-new-tokens 128] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evalsuite.target.chat import fit_to_template  # noqa: E402
from evalsuite.target.model import TargetModel  # noqa: E402
from evalsuite.train import data as data_mod  # noqa: E402
from evalsuite.train import mixture  # noqa: E402
from evalsuite.train import mixture  # noqa: E402
from evalsuite.train.generate import GenerationOptions, read_sequences, regenerate  # noqa: E402

SWE = ROOT / "tasks/training/mini-swe-agent_gemini-3-pro_train.jsonl.gz"


def chain_depths(agree: list[bool], k: int) -> list[int]:
    """For each anchor i (the last accepted token is reply position i-1): consecutive agreements from i, capped."""
    depths, run = [0] * len(agree), 0
    for i in range(len(agree) - 1, -1, -1):
        run = run + 1 if agree[i] else 0
        depths[i] = min(run, k)
    return depths


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, default=24)
    ap.add_argument("--k", type=int, default=7)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--min-context", type=int, default=1024)
    ap.add_argument("--max-context", type=int, default=6000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = TargetModel.load("default", weight_layout="row-major")  # as `evalsuite train` loads it
    heldout = data_mod.build_heldout()
    selected = mixture.select_prompts(
        [f"swe:{SWE}"], heldout,
        data_mod.PromptOptions(num_prompts=args.contexts, min_context_tokens=args.min_context,
                               max_context_tokens=args.max_context, max_per_trajectory=1, seed=args.seed))
    trajectories = dict(mixture.load_trajectories(str(SWE)))
    convs = selected.conversations

    # regenerated: batched greedy generation, exactly as the training pipeline runs it
    options = GenerationOptions(max_prompt_tokens=args.max_context + 1000, max_new_tokens=args.max_new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "responses.jsonl"
        t0 = time.process_time()
        regenerate(target, convs, out, options)
        regen_cpu = time.process_time() - t0
        regen = {s.conv_id: s for s in read_sequences(out)}

    # logged: one teacher-forced forward over context + the logged assistant reply
    logged_cpu, agree_all, depth_logged, positions_logged, context_tokens = 0.0, [], [], 0, []
    for conv in convs:
        traj_id, cut = conv.conv_id.removeprefix("swe-").rsplit("-m", 1)
        reply = trajectories[traj_id][int(cut)]
        messages, _ = fit_to_template(conv.as_messages(), None, target.chat_template or "")
        ctx = target.render(messages)
        reply_ids = target.tokenizer(data_mod.message_text(reply), add_special_tokens=False)["input_ids"]
        reply_ids = reply_ids + [target.tokenizer.eos_token_id]
        ids = torch.tensor([ctx + reply_ids], device=target.device)
        t0 = time.process_time()
        with torch.inference_mode():
            logits = target.model(input_ids=ids).logits[0]
        logged_cpu += time.process_time() - t0
        preds = logits[len(ctx) - 1: len(ctx) - 1 + len(reply_ids)].argmax(-1).tolist()
        agree = [p == t for p, t in zip(preds, reply_ids)]
        agree_all += agree
        depth_logged += chain_depths(agree, args.k)
        positions_logged += len(reply_ids)
        context_tokens.append(len(ctx))

    regen_positions = sum(len(s.response_ids) for s in regen.values())
    depth_regen = [min(args.k, len(s.response_ids) - i) for s in regen.values() for i in range(len(s.response_ids))]
    full_regen = sum(d == args.k for d in depth_regen)
    full_logged = sum(d == args.k for d in depth_logged)
    rows = {
        "regenerated": {"cpu_s": regen_cpu, "label_positions": regen_positions,
                        "mean_chain_depth": sum(depth_regen) / max(len(depth_regen), 1),
                        "full_depth_chains": full_regen,
                        "positions_per_cpu_s": regen_positions / regen_cpu,
                        "full_chains_per_cpu_s": full_regen / regen_cpu,
                        "chain_tokens_per_cpu_s": sum(depth_regen) / regen_cpu},
        "logged": {"cpu_s": logged_cpu, "label_positions": positions_logged,
                   "top1_agreement_with_logged_text": sum(agree_all) / max(len(agree_all), 1),
                   "mean_chain_depth": sum(depth_logged) / max(len(depth_logged), 1),
                   "full_depth_chains": full_logged,
                   "positions_per_cpu_s": positions_logged / logged_cpu,
                   "full_chains_per_cpu_s": full_logged / logged_cpu,
                   "chain_tokens_per_cpu_s": sum(depth_logged) / logged_cpu},
    }
    result = {"contexts": len(convs), "k": args.k, "max_new_tokens": args.max_new_tokens,
              "context_tokens_mean": sum(context_tokens) / max(len(context_tokens), 1),
              "threads": args.threads, "machine": platform.processor() or platform.machine(), "sources": rows}
    print(json.dumps(result, indent=1))
    print(f"\n| label source | CPU s | label positions | mean usable chain depth (K={args.k}) | full-depth chains "
          f"per CPU-s | chain tokens per CPU-s |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['cpu_s']:.1f} | {r['label_positions']} | {r['mean_chain_depth']:.2f} | "
              f"{r['full_chains_per_cpu_s']:.2f} | {r['chain_tokens_per_cpu_s']:.1f} |")
    print(f"\ntarget top-1 agreement with the logged agent text: "
          f"{rows['logged']['top1_agreement_with_logged_text']:.3f}")


if __name__ == "__main__":
    main()
