"""Studies longer than a session on machines that do not outlive it (benchmarks/publish_report.sh): the unfinished
runs are saved into a tracked folder and a fresh staging folder starts from them, a staging folder that already
holds runs is never overwritten, a save refuses while a run writes into the stage or when there is nothing to
save, and the study scripts name a tracked folder only for their default staging folder. Also the training
script's METHODS selection refuses an unknown drafter before it does anything."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELPERS = ROOT / "benchmarks" / "publish_report.sh"


def _sh(script: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f". {HELPERS}\n{script}"], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def _stage_with_runs(stage: Path) -> None:
    (stage / "runs" / "swebench-points").mkdir(parents=True)
    (stage / "runs" / "swebench-points" / "run.json").write_text('{"method": ["ar"]}')
    (stage / "runs" / "swebench-points" / "turns.parquet").write_bytes(b"PAR1 rows")
    (stage / "context_cost_cpu.txt").write_text("# measured once\n")
    (stage / "index.html").write_text("a built report, not part of the seed")


def test_save_then_seed_round_trip(tmp_path):
    stage, seed, fresh = tmp_path / "stage", tmp_path / "seed", tmp_path / "fresh"
    _stage_with_runs(stage)
    saved = _sh(f"save_partial {stage} {seed}", tmp_path)
    assert saved.returncode == 0, saved.stderr
    assert "commit it" in saved.stdout
    assert sorted(p.relative_to(seed).as_posix() for p in seed.rglob("*") if p.is_file()) == [
        "context_cost_cpu.txt", "runs/swebench-points/run.json", "runs/swebench-points/turns.parquet"]
    seeded = _sh(f"seed_partial {fresh} {seed}", tmp_path)
    assert seeded.returncode == 0, seeded.stderr
    assert "started from the committed unfinished runs" in seeded.stdout
    assert (fresh / "runs" / "swebench-points" / "turns.parquet").read_bytes() == b"PAR1 rows"
    assert (fresh / "context_cost_cpu.txt").read_text() == "# measured once\n"


def test_seed_never_overwrites_a_stage_with_runs(tmp_path):
    stage, seed = tmp_path / "stage", tmp_path / "seed"
    _stage_with_runs(seed)
    (stage / "runs" / "mine").mkdir(parents=True)
    out = _sh(f"seed_partial {stage} {seed}", tmp_path)
    assert out.returncode == 0 and out.stdout == ""
    assert [p.name for p in (stage / "runs").iterdir()] == ["mine"]
    # no seed folder (or none given): only the staging folder is made
    empty = _sh(f"seed_partial {tmp_path / 'other'} {tmp_path / 'absent'} && seed_partial {tmp_path / 'third'} ''",
                tmp_path)
    assert empty.returncode == 0 and empty.stdout == ""
    assert (tmp_path / "other" / "runs").is_dir() and (tmp_path / "third" / "runs").is_dir()


def test_save_refuses_without_runs_or_seed(tmp_path):
    (tmp_path / "stage").mkdir()
    out = _sh(f"save_partial {tmp_path / 'stage'} {tmp_path / 'seed'}", tmp_path)
    assert out.returncode == 2 and "no runs in" in out.stderr
    out = _sh(f"save_partial {tmp_path / 'stage'} ''", tmp_path)
    assert out.returncode == 2 and "no PARTIAL folder given" in out.stderr
    assert not (tmp_path / "seed").exists()


def test_save_refuses_while_a_run_writes_into_the_stage(tmp_path):
    stage, seed = tmp_path / "stage", tmp_path / "seed"
    _stage_with_runs(stage)
    # a stand-in process whose command line is an evalsuite run writing into the stage
    fake = subprocess.Popen(["python3", "-c", "import time; time.sleep(30)", "evalsuite run --method ar --out",
                             f"{stage}/runs/x"])
    try:
        out = _sh(f"save_partial {stage} {seed}", tmp_path)
    finally:
        fake.kill()
        fake.wait()
    assert out.returncode == 2 and "still writes into" in out.stderr
    assert not seed.exists()


def test_study_scripts_name_a_tracked_seed_only_for_their_default_stage(tmp_path):
    for script, seed in (("long_context_study.sh", "benchmarks/results/long-context-study-partial"),
                         ("bfcl_closed_qwen.sh", "benchmarks/results/bfcl-closed-qwen-partial"),
                         ("example_report.sh", "benchmarks/results/example-report-partial")):
        # SAVE_PARTIAL exits before anything runs: with the default stage it names the tracked seed ...
        env = {**os.environ, "SAVE_PARTIAL": "1", "STAGE": str(tmp_path / "nothing")}
        out = subprocess.run(["bash", str(ROOT / "benchmarks" / script)], env=env, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 2 and "no PARTIAL folder given" in out.stderr, (script, out.stderr)
        text = (ROOT / "benchmarks" / script).read_text()
        assert f"PARTIAL=${{PARTIAL-{seed}}}" in text


def test_train_script_refuses_an_unknown_drafter(tmp_path):
    env = {**os.environ, "METHODS": "dspark,medusa", "EVALSUITE": "false"}
    out = subprocess.run(["bash", str(ROOT / "benchmarks" / "train_qwen_drafters.sh"), str(tmp_path / "out")],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "METHODS: unknown drafter 'medusa'" in out.stderr
    assert not (tmp_path / "out").exists()


def test_train_script_copies_an_init_head_only_when_its_shape_matches(tmp_path):
    """INIT warm-starts DLite's backbone; its RNN head is copied only when rank and draft vocabulary match this
    run's (DLITE_RANK, DLITE_VOCAB), otherwise --set init_head=false and the head gets its own warm start."""
    fake = tmp_path / "evalsuite"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$*" >> "$ARGS_LOG"\n')
    fake.chmod(0o755)

    def dlite_args(config: dict, **env_extra) -> str:
        init = tmp_path / f"init{len(list(tmp_path.glob('init*')))}"
        (init / "dlite").mkdir(parents=True)
        (init / "dlite" / "config.json").write_text(json.dumps({"dlite_config": config}, indent=1))
        log = tmp_path / "args.log"
        log.unlink(missing_ok=True)
        env = {**os.environ, "METHODS": "dlite", "SKIP_DATA": "1", "EVAL": "0", "EVALSUITE": str(fake),
               "ARGS_LOG": str(log), "INIT": str(init), **env_extra}
        out = subprocess.run(["bash", str(ROOT / "benchmarks" / "train_qwen_drafters.sh"), str(tmp_path / "out")],
                             env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        (line,) = [a for a in log.read_text().splitlines() if a.startswith("train --method dlite")]
        return line

    same = dlite_args({"sequential_rank": 128, "draft_vocab_size": 16384})
    assert "--set head_warm_start_steps=0" in same and "init_head" not in same
    assert "--set rank=128" in same and "--set draft_vocab=16384" in same
    for config in ({"sequential_rank": 20}, {"sequential_rank": 128}, {"sequential_rank": 64, "draft_vocab_size": 16384}):
        other = dlite_args(config)
        assert "--set init_head=false" in other and "head_warm_start_steps" not in other, config
    full = dlite_args({"sequential_rank": 20}, DLITE_VOCAB="0", DLITE_RANK="20")
    assert "--set head_warm_start_steps=0" in full and "--set draft_vocab=0" in full
