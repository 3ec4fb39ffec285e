"""Scale-out on Ray: same records as one process, a killed worker's unit retried, resume after a driver crash,
and the single-process path that never imports Ray. One local Ray cluster (2 CPUs) serves the whole module."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.store.run_store import read_run
from tests.helpers import load_steps, load_turns

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
cli = CliRunner()
KEY = ["method", "sample_id", "turn"]
SAMPLES = 4


def run_args(target: Path, out: Path, *extra: str) -> list[str]:
    return ["run", "--method", "ngram,ar", "--task", "mt-bench", "--target", str(target), "--limit", str(SAMPLES),
            "--max-new-tokens", "24", "--k", "4", "--out", str(out), "--no-warmup", *extra]


def finished_samples(run_dir: Path) -> set[str]:
    """Samples whose trajectory is stored for both methods."""
    pairs = read_run(run_dir).finished_pairs()
    return {s for m, s in pairs if (("ar" if m == "ngram" else "ngram"), s) in pairs}


def wait_for_no_live_actors(timeout_s: float = 120.0) -> None:
    """Until the cluster holds no actor of another job (the killed driver's) that is alive or about to be; the
    state is read from Ray's GCS, and this process's own actors (earlier tests) are left alone."""
    import ray
    from ray._private import state

    own_job = ray.get_runtime_context().get_job_id()
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if not any(a["State"] in ("ALIVE", "PENDING_CREATION", "RESTARTING", "DEPENDENCIES_UNREADY")
                   and a["JobID"] != own_job for a in state.actors().values()):
            return
        time.sleep(0.2)
    raise AssertionError(f"the killed driver's actors were still alive after {timeout_s:.0f} s")


def assert_same_records(got_dir: Path, want_dir: Path) -> None:
    got, want = load_turns(got_dir), load_turns(want_dir)
    assert not got.duplicated(KEY).any()
    assert len(got) == len(want) == SAMPLES * 2 * 2  # samples x turns x methods
    merged = got.merge(want, on=KEY, suffixes=("", "_ref"))
    assert len(merged) == len(want)
    assert all(list(a) == list(b) for a, b in zip(merged.output_ids, merged.output_ids_ref))
    assert list(merged.tau) == pytest.approx(list(merged.tau_ref), nan_ok=True)
    steps = load_steps(got_dir)
    assert not steps.duplicated(KEY + ["step"]).any()
    assert len(steps) == len(load_steps(want_dir))


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    """Saved as safetensors so that Ray workers can load it by path."""
    from evalsuite.testing import build_tiny_target

    return build_tiny_target(tmp_path_factory.mktemp("ray-target") / "qwen3", "qwen3")


@pytest.fixture(scope="module")
def reference(tiny_target, tmp_path_factory):
    out = tmp_path_factory.mktemp("ray-runs") / "single"
    result = cli.invoke(app, run_args(tiny_target, out), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def cluster():
    import logging

    import ray

    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@needs_ray
def test_two_workers_give_the_single_process_records(cluster, tiny_target, reference, tmp_path):
    out = tmp_path / "two"
    result = cli.invoke(app, run_args(tiny_target, out, "--workers", "2", "--threads-per-worker", "1"),
                        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "not comparable to single-worker runs" in result.output  # 2 CPU workers share this node
    assert_same_records(out, reference)
    turns = load_turns(out)
    assert turns.worker_device.str.startswith("cpu (").all() and (turns.worker_host != "").all()
    # the driver's bar aggregates all workers: token-weighted τ per method over every finished trajectory
    ngram = turns[(turns.method == "ngram") & (turns.num_steps > 0)]
    tau = (ngram.tau * ngram.num_steps).sum() / ngram.num_steps.sum()
    assert f"{SAMPLES}/{SAMPLES}" in result.output and f"ngram {tau:.2f}" in " ".join(result.output.split())
    scaleout = json.loads((out / "run.json").read_text())["scaleout"]
    import ray

    assert scaleout["workers"] == 2 and scaleout["ray_version"] == ray.__version__
    assert scaleout["shared_cpu"] is True and scaleout["threads_per_worker"] == 1
    assert [w["threads"] for w in scaleout["worker_info"]] == [1, 1]
    assert {w["host"] for w in scaleout["worker_info"]} == set(turns.worker_host)


@needs_ray
def test_a_killed_worker_has_its_unit_retried(cluster, tiny_target, reference, tmp_path):
    from evalsuite.config import RunConfig
    from evalsuite.scaleout import run_on_ray

    out = tmp_path / "killed"
    config = RunConfig(methods=["ngram", "ar"], task="mt-bench", target=str(tiny_target), k=4, max_new_tokens=24,
                       limit=SAMPLES, warmup=False, out=str(out), workers=2, threads_per_worker=1)
    started, results, killed = {}, [], []

    def on_unit(result: dict) -> None:
        results.append(result)
        if not killed:
            # The pool has just handed this worker its next unit: kill its process in the middle of it.
            killed.append(result["pid"])
            os.kill(result["pid"], signal.SIGKILL)

    run_on_ray(config, out, say=lambda text: None,
               on_start=lambda run: started.update(pids={w["pid"] for w in run.workers}), on_unit=on_unit)
    assert len(results) == SAMPLES and len({r["sample_id"] for r in results}) == SAMPLES
    assert killed[0] in started["pids"]
    # the interrupted unit finished on the restarted actor, in a new process
    assert any(r["pid"] not in started["pids"] for r in results)
    assert_same_records(out, reference)


@needs_ray
def test_resume_after_a_driver_crash_fills_only_the_missing_trajectories(cluster, tiny_target, reference, tmp_path):
    out = tmp_path / "crashed"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    command = [sys.executable, "-m", "evalsuite.cli", *run_args(tiny_target, out, "--workers", "2",
                                                               "--threads-per-worker", "1", "--ray-address", cluster)]
    driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.time() + 240
    while time.time() < deadline and not finished_samples(out) and driver.poll() is None:
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    _, stderr = driver.communicate()
    # The actors write the store themselves and outlive their driver by a moment (Ray reaps them once it sees the
    # owner gone): a unit finishing in that moment is stored too, so what counts as finished is read afterwards.
    wait_for_no_live_actors()
    finished = finished_samples(out)
    assert 1 <= len(finished) < SAMPLES, f"the crash must land mid-run: {stderr.decode()[-2000:]}"
    before = load_turns(out).set_index(KEY)
    # a run started on 2 workers resumes with any number: here in this process, without Ray
    result = cli.invoke(app, run_args(tiny_target, out, "--resume"), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"plan: {SAMPLES - len(finished)} of {SAMPLES} samples" in " ".join(result.output.split())
    after = load_turns(out).set_index(KEY)
    stored = [key for key in before.index if key[1] in finished]
    assert after.loc[stored, "decode_s"].tolist() == before.loc[stored, "decode_s"].tolist(), \
        "finished trajectories must not rerun"
    assert_same_records(out, reference)
    assert json.loads((out / "run.json").read_text())["resumes"]


def test_one_worker_runs_in_process_without_importing_ray(tiny_llama_dir, tmp_path):
    out = tmp_path / "single"
    code = ("import sys; from typer.testing import CliRunner; from evalsuite.cli import app; "
            f"r = CliRunner().invoke(app, {run_args(tiny_llama_dir, out, '--limit', '1')!r}); "
            "assert r.exit_code == 0, r.output; print('ray imported:', 'ray' in sys.modules)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "ray imported: False" in done.stdout
    turns = load_turns(out)
    assert turns.worker_device.str.startswith("cpu (").all() and (turns.worker_host != "").all()
    scaleout = json.loads((out / "run.json").read_text())["scaleout"]
    assert scaleout["workers"] == 1 and scaleout["ray_version"] is None


def test_many_workers_without_ray_is_a_one_line_error(monkeypatch, tiny_llama_dir, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    result = cli.invoke(app, run_args(tiny_llama_dir, tmp_path / "x", "--workers", "2"))
    assert result.exit_code == 2
    error = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "pip install 'evalsuite[ray]'" in error[0]


def test_gpus_per_worker_needs_a_cuda_device(tiny_llama_dir, tmp_path):
    result = cli.invoke(app, run_args(tiny_llama_dir, tmp_path / "x", "--workers", "2", "--gpus-per-worker", "1"))
    assert result.exit_code == 2 and "--device cuda" in result.output
