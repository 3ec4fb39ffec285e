"""benchmarks/gpu_profile.sh, the prepared GPU run, on this CPU with a tiny shape: the same command path writes the
cost tables, run.json and the break-even map; the GPU defaults are what the script says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_profile.sh"


def test_gpu_profile_script_runs_with_a_tiny_shape_on_cpu(tmp_path):
    results = tmp_path / "results"
    env = {**os.environ, "PYTHON": sys.executable, "SHAPE": "tiny", "DEVICE": "cpu", "DTYPE": "float32",
           "BATCH": "1,2", "CONTEXTS": "64,128", "TIME_LIMIT": "300", "OMP_NUM_THREADS": "1",
           "OUT": str(tmp_path / "device_out")}
    (tmp_path / "device_out").mkdir()
    done = subprocess.run(["bash", str(SCRIPT), str(results)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    target = pd.read_parquet(results / "profile" / "target_cost.parquet")
    draft = pd.read_parquet(results / "profile" / "draft_cost.parquet")
    assert len(target) == 2 * 2 * 8 and target.fits.all() and (target.ms > 0).all()
    assert set(draft.method) == {"dlite", "eagle3", "dflash", "dspark"} and len(draft) == 4 * 2 * 2
    assert set(draft[draft.batch == 2].batching) == {"batched"}
    run = json.loads((results / "profile" / "run.json").read_text())
    assert run["target"] == "shape:tiny" and run["dtype"] == "float32" and run["spec"]["time_limit_s"] == 300
    regime = pd.read_csv(results / "regime" / "regime.csv")
    assert set(regime.method) == {"ar", "dlite", "eagle3", "dflash", "dspark"}
    assert (results / "regime" / "regime_tau_break_even.png").is_file()
    returned = sorted(p.name for p in (tmp_path / "device_out").iterdir())
    assert len(returned) <= 8 and "target_cost.parquet" in returned and "regime.csv" in returned


def test_gpu_defaults_are_the_issue_s_sweep():
    text = SCRIPT.read_text()
    for default in ("SHAPE=${SHAPE:-qwen3-8b}", "DEVICE=${DEVICE:-cuda}", "DTYPE=${DTYPE:-bfloat16}",
                    "BATCH=${BATCH:-1..64}", "CONTEXTS=${CONTEXTS:-1k..128k}",
                    "METHODS=${METHODS:-dlite,eagle3,dflash,dspark}", "benchmarks/results/gpu_profile"):
        assert default in text, default
