"""A newcomer's first hour: contention is measured and said, an interrupt loses nothing and the printed command
continues the run, `ar` is reported whenever it ran, the plan estimates, and mistakes are refused fast."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evalsuite import contention
from evalsuite.cli import app
from tests.helpers import load_turns

ROOT = Path(__file__).resolve().parents[1]
cli = CliRunner()


def run_args(target: Path, out: Path, *extra: str) -> list[str]:
    return ["run", "--method", "ngram", "--task", "mt-bench", "--target", str(target), "--limit", "2",
            "--max-new-tokens", "16", "--k", "4", "--out", str(out), *extra]


def child_env(**extra) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "EVALSUITE_CPU_SAMPLE_S": "0.2", **extra}


@pytest.fixture
def cpu_hog():
    """One busy process, bounded in time, stopped by the test."""
    hog = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 120\nwhile time.time() < end: pass"])
    time.sleep(0.3)
    try:
        yield hog
    finally:
        hog.kill()
        hog.wait()


def test_a_run_beside_a_cpu_hog_records_the_contention_and_says_so(cpu_hog, tiny_llama_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("EVALSUITE_CPU_SAMPLE_S", "0.5")
    snap = contention.snapshot()
    assert snap.other_cores_busy >= 0.5 and snap.contended and snap.free_cores <= contention.cores() - 1 or \
        contention.cores() == 1
    out = tmp_path / "busy"
    # decodes long enough for /proc/stat's clock ticks to tell (contention.shortest_window_s: 80 ms on 2 cores)
    result = cli.invoke(app, run_args(tiny_llama_dir, out, "--max-new-tokens", "400"))
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("warning: other processes keep")]
    assert len(lines) == 1 and "not comparable" in lines[0]
    assert "decodes ran while other processes kept" in result.output  # the summary's line
    config = json.loads((out / "run.json").read_text())
    assert config["contention"]["contended"] is True and config["contention"]["threads_requested"] == "auto"
    turns = load_turns(out)
    assert turns.contended.any() and (turns.cpu_others[turns.contended] >= 0.5).all()


def test_an_idle_measurement_is_not_contended():
    quiet = contention.Snapshot(cores=2, other_cores_busy=0.1, cpu_pressure_avg10=0.0, load_average_1min=0.2,
                                sample_s=0.5)
    assert not quiet.contended and quiet.free_cores == 2 and quiet.warning(2) == ""
    busy = contention.Snapshot(cores=2, other_cores_busy=1.2, cpu_pressure_avg10=40.0, load_average_1min=3.0,
                               sample_s=0.5)
    assert busy.contended and busy.free_cores == 1 and contention.resolve_threads("auto", busy) == 1
    assert contention.resolve_threads(2, busy) == 2


def test_a_decode_too_short_for_the_clock_ticks_is_unknown_not_contended(monkeypatch):
    """/proc/stat counts whole clock ticks (10 ms): over a 2 ms decode (a reply that is EOS at once) one tick of our
    own time read as 4 cores of others'. Such a window is unknown (None: NaN in the records, not contended); over a
    long window the same arithmetic measures."""
    from types import SimpleNamespace

    monkeypatch.setattr(contention, "cores", lambda: 2)
    assert contention.shortest_window_s() == pytest.approx(2 * 2 / contention._TICKS / 0.5)
    clock = {"wall": 0.0, "busy": 100.0, "own": 1.0}
    monkeypatch.setattr(contention, "time", SimpleNamespace(perf_counter=lambda: clock["wall"], sleep=time.sleep))
    monkeypatch.setattr(contention, "_cpu_busy_seconds", lambda: (clock["busy"], 1000.0))
    monkeypatch.setattr(contention, "_own_cpu_seconds", lambda: clock["own"])

    def window(wall: float, busy: float, own: float, meter_type=contention.DecodeMeter):
        meter = meter_type()
        meter.start()
        clock["wall"] += wall
        clock["busy"] += busy
        clock["own"] += own
        return meter.stop()

    # 2 ms, one tick on the busy counter, 2 ms of our own time: (0.010 - 0.002) / 0.002 = 4 "cores": unknown
    assert window(0.002, 0.010, 0.002) is None
    # just under the shortest window, still unknown; 2 s with others at 0.6 cores: measured, and contended
    assert window(contention.shortest_window_s() * 0.99, 0.05, 0.04) is None
    assert window(2.0, 2.0 + 1.2, 2.0) == pytest.approx(0.6)
    # 2 s with only our own time: idle
    assert window(2.0, 4.0, 4.0) == pytest.approx(0.0)
    # the machine's snapshot before a run samples over a window it chooses itself: no such floor
    assert window(0.05, 0.05 + 0.03, 0.05, contention.Meter) == pytest.approx(0.6)


def test_the_printed_resume_command_run_as_printed_continues_the_run(tiny_llama_dir, tmp_path):
    out = tmp_path / "interrupted"
    # 6 samples of 400 tokens: enough left after the first stored turn that SIGINT lands mid-run even when the
    # test process is slow to notice that turn (with 2 samples a loaded machine let the run finish first)
    samples = 6
    args = run_args(tiny_llama_dir, out, "--max-new-tokens", "400", "--limit", str(samples))
    # SIGINT back to its default in the child: a test process started in the background (`nohup pytest &`)
    # inherits SIGINT ignored, and so would the run, which then finished instead of stopping
    proc = subprocess.Popen([sys.executable, "-m", "evalsuite.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=child_env(), cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not any((out / "turns.parquet").glob("*.parquet")):
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, output
    kept = load_turns(out)
    assert 0 < len(kept) < samples * 2 * 2  # some turns stored, not all (samples x 2 turns x ngram, ar)
    command = output.strip().splitlines()[-1]
    assert shlex.split(command)[:3] == [sys.executable, "-m", "evalsuite.cli"] and command.endswith("--resume")
    done = subprocess.run(command, shell=True, capture_output=True, text=True, env=child_env(), cwd=tmp_path,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    turns = load_turns(out)
    assert len(turns) == samples * 2 * 2 and not turns.duplicated(["method", "sample_id", "turn"]).any()
    stored = kept.set_index(["method", "sample_id", "turn"]).decode_s
    assert (turns.set_index(["method", "sample_id", "turn"]).decode_s.loc[stored.index] == stored).all()


def test_ngram_alone_records_ar_and_the_summary_shows_it(tiny_llama_dir, tmp_path):
    out = tmp_path / "ngram"
    result = cli.invoke(app, run_args(tiny_llama_dir, out))
    assert result.exit_code == 0, result.output
    turns = load_turns(out)
    assert set(turns.method) == {"ar", "ngram"}
    rows = [line for line in result.output.splitlines() if line.startswith("│ ar ")]
    assert len(rows) == 1 and "ms/token" in result.output and "same as ar" in result.output


def test_the_plan_estimates_from_measured_costs(tiny_llama_dir, tmp_path):
    result = cli.invoke(app, run_args(tiny_llama_dir, tmp_path / "plan"))
    assert result.exit_code == 0, result.output
    plan = " ".join(result.output.split())
    assert "2 of 2 samples to run, 4 turns in all (2 + 2); 8 turn decodes over 2 methods (ar, ngram)" in plan
    assert "estimated" in plan and "≤" not in plan and "ms/token at 64 tokens of context" in plan


def test_a_long_plan_offers_a_sized_command(tiny_llama_dir, tmp_path, monkeypatch):
    from evalsuite.run import plan as plan_module

    monkeypatch.setattr(plan_module, "LONG_PLAN_S", 0.0)
    monkeypatch.setattr(plan_module, "SIZED_TARGET_S", 1e9)
    result = cli.invoke(app, ["run", "--method", "ngram", "--task", "mt-bench", "--target", str(tiny_llama_dir),
                              "--limit", "3", "--max-new-tokens", "4", "--out", str(tmp_path / "long")])
    assert result.exit_code == 0, result.output
    advice = " ".join(result.output.split())
    assert "over an hour" in advice and "--limit 3 --max-turns 2" in advice and "--task mt-bench" in advice


def test_a_method_typo_is_refused_fast_with_a_suggestion_and_leaves_no_directory(tmp_path):
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "evalsuite.cli", "run", "--method", "dlte", "--task", "gsm8k",
                           "--out", str(tmp_path / "typo")], capture_output=True, text=True, env=child_env())
    elapsed = time.perf_counter() - start
    assert done.returncode == 2 and "did you mean dlite?" in done.stderr and elapsed < 2.0, (elapsed, done.stderr)
    assert not (tmp_path / "typo").exists()
    task = subprocess.run([sys.executable, "-m", "evalsuite.cli", "run", "--task", "swebnch"], capture_output=True,
                          text=True, env=child_env(), cwd=tmp_path)
    assert task.returncode == 2 and "did you mean swebench?" in task.stderr and not (tmp_path / "results").exists()


def test_a_run_that_fails_before_its_first_turn_leaves_no_directory(tiny_llama_dir, tmp_path):
    out = tmp_path / "failed"
    result = cli.invoke(app, ["run", "--method", "ngram", "--task", "custom", "--target", str(tiny_llama_dir),
                              "--data-path", str(tmp_path / "missing.jsonl"), "--out", str(out)])
    assert result.exit_code == 2 and not out.exists()


def test_an_unexpected_error_is_one_line_with_its_own_message(tmp_path):
    code = ("import evalsuite.run.runner as r\n"
            "def broken(*a, **k):\n"
            "    raise AttributeError('module numpy has no attribute from_pyarrow')\n"
            "r.Runner.load = broken\n"
            "import evalsuite.cli as c\n"
            "c.main()\n")
    done = subprocess.run([sys.executable, "-c", code, "run", "--method", "ngram", "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, env=child_env(EVALSUITE_CACHE=str(tmp_path)))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(" ".join(lines).split("error:")) == 2 and "AttributeError: module numpy has no attribute" in lines[0]
    assert "Traceback" in (tmp_path / "last-error.txt").read_text()
