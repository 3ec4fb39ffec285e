"""Behaviour check across a code change: the same fixed-seed runs before and after give identical output ids,
step counts and τ per turn.

    python benchmarks/equivalence.py run --out DIR            # runs the fixed set with this checkout's CLI
    python benchmarks/equivalence.py run --out DIR -- --weight-layout fused+onednn   # options after -- added
    python benchmarks/equivalence.py digest DIR > A.json        # per (task, method, sample, turn): ids, steps, τ
    python benchmarks/equivalence.py compare A.json B.json      # exit 1 on any difference, naming it

`digest` reads the Parquet parts with pyarrow directly (not through evalsuite), so it reads the store of any
version. The fixed set: ar, ngram, dlite and suffix on GSM8K (3 samples) and SWE-Bench (2 trajectories × 4 turns),
48 new tokens, K=7, T=0, seed 0, one thread.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds

RUNS = {
    "gsm8k": ["--task", "gsm8k", "--limit", "3"],
    "swebench": ["--task", "swebench", "--limit", "2", "--max-turns", "4"],
}
COMMON = ["--method", "ar,ngram,dlite,suffix", "--max-new-tokens", "48", "--k", "7", "--seed", "0", "--threads", "1"]


def run(out: Path, extra: list[str]) -> None:
    for name, args in RUNS.items():  # this checkout's code: run from its root
        subprocess.run([sys.executable, "-m", "evalsuite.cli", "run", *COMMON, *args, *extra, "--out",
                        str(out / name)], check=True, cwd=Path(__file__).resolve().parents[1])


def _rows(table_dir: Path) -> list[dict]:
    parts = sorted(p for p in table_dir.rglob("*.parquet") if not p.name.startswith("."))
    return ds.dataset([str(p) for p in parts], format="parquet").to_table().to_pylist() if parts else []


def digest(out: Path) -> dict:
    found = {}
    for name in RUNS:
        steps = _rows(out / name / "steps.parquet")
        for turn in _rows(out / name / "turns.parquet"):
            key = f"{name}|{turn['method']}|{turn['sample_id']}|{turn['turn']}"
            mine = [s for s in steps if (s["method"], s["sample_id"], s["turn"]) ==
                    (turn["method"], turn["sample_id"], turn["turn"])]
            found[key] = {"output_ids": list(turn["output_ids"] or []), "num_steps": turn["num_steps"],
                          "steps": len(mine), "accepted": [s["num_accepted"] for s in sorted(mine, key=lambda s: s["step"])],
                          "tau": None if turn["tau"] != turn["tau"] else round(turn["tau"], 9),
                          "stop_reason": turn["stop_reason"]}
    return found


def compare(a: dict, b: dict) -> list[str]:
    lines = [f"{key}: only in the first" for key in sorted(set(a) - set(b))]
    lines += [f"{key}: only in the second" for key in sorted(set(b) - set(a))]
    for key in sorted(set(a) & set(b)):
        for field in a[key]:
            if a[key][field] != b[key].get(field):
                lines.append(f"{key}: {field} differs ({a[key][field]!r} vs {b[key].get(field)!r})")
    return lines


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "run":
        extra = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
        run(Path(sys.argv[sys.argv.index("--out") + 1]).resolve(), extra)
    elif command == "digest":
        print(json.dumps(digest(Path(sys.argv[2])), indent=1, sort_keys=True))
    elif command == "compare":
        a, b = (json.loads(Path(p).read_text()) for p in sys.argv[2:4])
        lines = compare(a, b)
        print("\n".join(lines) if lines else f"identical: {len(a)} (task, method, sample, turn) records")
        sys.exit(1 if lines else 0)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
