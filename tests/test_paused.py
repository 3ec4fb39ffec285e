"""benchmarks/paused.sh, the quiet-machine wrapper of every committed timing: the matching jobs are stopped before
the timed command starts and for as long as it runs, a job that starts meanwhile is stopped at the next look, and
all of them run again afterwards: when the command exits (its status passed on) and when the wrapper is killed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "paused.sh"


def _state(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("State:"):
            return line.split()[1]
    raise AssertionError("no State line")


@pytest.fixture
def job():
    """A stand-in for a background training: a sleeping python process with a unique tag in its command line."""
    tag = f"paused-test-{uuid.uuid4().hex[:8]}"
    procs = []

    def start():
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", tag])
        procs.append(proc)
        return proc
    yield tag, start
    for proc in procs:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()


def _wait_state(pid: int, wanted: str, seconds: float = 5.0) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state = _state(pid)
        if state == wanted:
            return state
        time.sleep(0.05)
    return _state(pid)


def test_jobs_are_stopped_while_the_command_runs_and_resumed_with_its_status(job):
    tag, start = job
    training = start()
    done = subprocess.run(["bash", str(SCRIPT), "--match", tag, "--", "bash", "-c",
                           f"grep State /proc/{training.pid}/status; exit 3"], capture_output=True, text=True)
    assert done.returncode == 3
    assert "T (stopped)" in done.stdout  # stopped before the command's first line ran
    assert _wait_state(training.pid, "S") == "S"


def test_a_job_started_meanwhile_is_stopped_at_the_next_look_and_resumed(job, tmp_path):
    tag, start = job
    flag = tmp_path / "started"
    pauser = subprocess.Popen(["bash", str(SCRIPT), "--match", tag, "--every", "0.2", "--", "bash", "-c",
                               f"while [ ! -f {flag} ]; do sleep 0.05; done; sleep 1"])
    late = start()
    flag.touch()
    assert _wait_state(late.pid, "T") == "T"
    assert pauser.wait(timeout=10) == 0
    assert _wait_state(late.pid, "S") == "S"


def test_a_killed_wrapper_still_resumes_the_jobs(job):
    tag, start = job
    training = start()
    pauser = subprocess.Popen(["bash", str(SCRIPT), "--match", tag, "--", "sleep", "30"])
    assert _wait_state(training.pid, "T") == "T"
    pauser.send_signal(signal.SIGTERM)
    pauser.wait(timeout=10)
    assert _wait_state(training.pid, "S") == "S"


def test_no_command_is_a_usage_line():
    done = subprocess.run(["bash", str(SCRIPT), "--match", "x", "--"], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("usage: bash benchmarks/paused.sh")
