"""The end-of-run summary: one row per method, computed from the stored tables (a pure function of them)."""

from __future__ import annotations

from pathlib import Path

from evalsuite.records import load_steps, load_turns


def summary_rows(run_dir: str | Path) -> list[dict]:
    steps = load_steps(run_dir)
    turns = load_turns(run_dir)
    rows = []
    for method, group in turns.groupby("method", sort=False):
        decoded = group[group.stop_reason != "skipped"]
        method_steps = steps[steps.method == method]
        n_steps = len(method_steps)
        tokens = int(decoded.new_tokens.sum())
        decode_s = float(decoded.decode_s.sum())
        ar_tokens = int(decoded.ar_new_tokens.sum())
        ar_decode_s = float(decoded.ar_decode_s.sum())
        rows.append({
            "method": method,
            "samples": decoded.sample_id.nunique(),
            "turns": len(decoded),
            "skipped": int((group.stop_reason == "skipped").sum()),
            "tau": float((method_steps.num_accepted + 1).sum() / n_steps) if n_steps else float("nan"),
            "tau_turn_mean": float(decoded.tau.mean()) if len(decoded) else float("nan"),
            "tokens": tokens,
            "tok/s": tokens / decode_s if decode_s else float("nan"),
            "draft ms/step": 1e3 * float(method_steps.draft_s.mean()) if n_steps else float("nan"),
            "verify ms/step": 1e3 * float(method_steps.verify_s.mean()) if n_steps else float("nan"),
            # pooled per-token decode time ratio over all paired turns
            "speedup": (ar_decode_s / ar_tokens) / (decode_s / tokens) if tokens and ar_tokens and decode_s else
            float("nan"),
        })
    return rows
