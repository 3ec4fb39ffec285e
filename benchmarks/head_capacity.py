"""How much of the target's own next token a small vocabulary head can reproduce: the ceiling a drafter's head puts
on its first-position acceptance, before any drafting is learned.

A drafter that owns its vocabulary head (DLite's rank-R RNN head: `prev_token_embedding` and `output_proj`, each
[V, R]; EAGLE-3's `lm_head` over a reduced draft vocabulary of V' tokens) maps its last hidden state to logits
through that head. The easiest thing such a head can be asked is the target's own greedy token from the target's
own last-layer (post-norm) hidden state; a head that cannot reproduce that cannot draft it either. This fits
logits = A (B h), A [V', R], B [R, H], by cross-entropy on the reply positions of a training feature cache
(`evalsuite train --prepare-only` writes one), for each rank R and vocabulary size V' asked, and prints:

- coverage: the share of held-out positions whose greedy token is among the V' most frequent greedy tokens of the
  training positions (a head over V' tokens can be right at most that often; a full-rank head over them, as
  EAGLE-3's, reaches exactly it, since dropping rows of the target's lm_head keeps the argmax where it stays);
- accuracy: the fitted rank-R head's argmax against the target's greedy token on held-out positions (tokens outside
  the V' count as misses);
- the head's bytes in DLite's format at fp16 (two [V', R] matrices).

Held-out positions are whole held-out sequences (10 %, seeded), not positions of training sequences. Every head
starts from the truncated SVD of the target's lm_head rows for its V' tokens (`lm_head_factors`) and is fitted by
`fit_low_rank_head` (the DLite recipe's head warm start, with its memo beside the feature cache) on the training
sequences; the draft vocabulary is `draft_vocabulary` of the training sequences (the recipes' own choice).

    python benchmarks/head_capacity.py --work-dir runs/qwen-drafters-math/work --target qwen2.5-coder-0.5b \
        --ranks 20,64,128 --vocabs full,32768,16384 --steps 1500 --threads 2
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from evalsuite.target.model import TargetModel
from evalsuite.train.features import FeatureCache
from evalsuite.train.recipes.common import draft_vocabulary, fit_low_rank_head, lm_head_factors, reply_states


def parse_sizes(text: str, full: int) -> list[int]:
    return [full if part == "full" else int(part) for part in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work-dir", required=True, help="a training work directory (its features/ is read)")
    ap.add_argument("--target", default="default")
    ap.add_argument("--ranks", default="20,64,128")
    ap.add_argument("--vocabs", default="full,32768,16384", help="vocabulary sizes V' ('full': the target's)")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--limit", type=int, default=200_000, help="at most this many training positions")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cache = FeatureCache(Path(args.work_dir) / "features")
    target = TargetModel.load(args.target, "cpu")
    last_layer = target.num_layers - 1  # the post-norm state (the DLite recipe's head warm start reads the same)
    order = np.random.default_rng(args.seed).permutation(len(cache))
    n_held = max(1, len(order) // 10)
    held_seqs, train_seqs = sorted(order[:n_held].tolist()), sorted(order[n_held:].tolist())
    h_held, y_held = reply_states(cache, held_seqs, cache.layer_index([last_layer], "head_capacity")[0])
    vocab_size = target.vocab_size
    print(f"target {args.target}: vocabulary {vocab_size:,}, hidden {target.hidden_size}; feature layer "
          f"{last_layer} (post-norm); {len(train_seqs)} training sequences, {len(held_seqs)} held-out sequences "
          f"({h_held.shape[0]:,} positions); head warm start: {args.steps} steps (fit_low_rank_head: batch 256, "
          f"peak lr 3e-3, cosine, at most {args.limit:,} positions); {args.threads} threads")
    print(f"{'V':>8s} {'coverage':>9s} {'rank':>5s} {'accuracy':>9s} {'train loss':>11s} "
          f"{'head MB (fp16, 2 x V x R)':>26s} {'fit s':>6s}", flush=True)
    for v in parse_sizes(args.vocabs, vocab_size):
        kept = draft_vocabulary(cache, train_seqs, v, vocab_size) if v < vocab_size else None
        covered = torch.ones_like(y_held, dtype=torch.bool)
        if kept is not None:
            covered = torch.isin(y_held, kept)
        for rank in parse_sizes(args.ranks, target.hidden_size):
            start = time.perf_counter()
            A, B = lm_head_factors(target, rank, kept)
            fit = fit_low_rank_head(cache, train_seqs, last_layer, A, B, args.steps, seed=args.seed,
                                    limit=args.limit, vocab=kept)
            with torch.no_grad():
                guess = ((h_held @ B.T) @ A.T).argmax(-1)
                if kept is not None:
                    guess = kept[guess]
            accuracy = float((guess == y_held).float().mean())
            print(f"{v:8d} {float(covered.float().mean()):9.4f} {rank:5d} {accuracy:9.4f} "
                  f"{fit['last_loss'] or float('nan'):11.4f} {2 * v * rank * 2 / 1e6:26.1f} "
                  f"{time.perf_counter() - start:6.0f}", flush=True)


if __name__ == "__main__":
    main()
