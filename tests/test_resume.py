"""Resume per turn: only the (method, turn) decodes not stored yet run, stored rows stay as they were, an interrupted
trajectory continues at its next turn and ends as an uninterrupted run, orphaned parts are ignored by every reader
and cleaned, drift is refused naming the field, and run.json keeps the original environment."""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from evalsuite.cli import app
from evalsuite.config import RunConfig
from evalsuite.report.load import load_results
from evalsuite.run.resume import differences, resume_command, resumed_config
from evalsuite.run.runner import Progress, Runner
from evalsuite.store.run_store import RunStore, read_run
from evalsuite.target.model import TargetModel
from tests.helpers import load_script, load_steps, load_turns

cli = CliRunner()
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "kill_resume.py"


def base_args(target_dir: Path, out: Path) -> list[str]:
    return ["run", "--method", "ngram,ar", "--task", "mt-bench", "--target", str(target_dir), "--limit", "2",
            "--max-new-tokens", "24", "--k", "4", "--out", str(out)]


def run_cli(*args: str):
    return cli.invoke(app, list(args), catch_exceptions=False)


# T=0 values that do not depend on interruptions (timings and prefill sharing may)
TURN_VALUES = ["method", "sample_id", "turn", "context_len", "new_tokens", "num_steps", "tau", "stop_reason",
               "output_ids", "last"]


def rows(out: Path, methods=None) -> list[tuple]:
    turns = load_turns(out)
    if methods is not None:
        turns = turns[turns.method.isin(methods)]
    return sorted(tuple(tuple(v) if hasattr(v, "__len__") and not isinstance(v, str) else
                        ("nan" if v != v else v) for v in row)
                  for row in turns[TURN_VALUES].itertuples(index=False))


def config_for(target_dir: Path, out: Path, methods: list[str], **extra) -> RunConfig:
    """The RunConfig `base_args` builds, for driving the Runner directly."""
    return RunConfig(methods=methods, task="mt-bench", target=str(target_dir), limit=2, max_new_tokens=24, k=4,
                     out=str(out), resume=True, **extra)


def decoded_methods(runner: Runner) -> set[str]:
    seen = set()
    runner.run(Progress(total=0, update=lambda info: seen.add(info["method"])))
    return seen


@pytest.fixture
def finished_run(tiny_qwen3_dir, tmp_path):
    out = tmp_path / "run"
    result = run_cli(*base_args(tiny_qwen3_dir, out))
    assert result.exit_code == 0, result.output
    return out


def test_an_added_method_is_the_only_one_decoded_and_stored_rows_stay(finished_run, tiny_qwen3_dir, tmp_path):
    from tests.helpers import dlite_checkpoint

    before = rows(finished_run)
    frame_before = load_turns(finished_run)
    config_before = json.loads((finished_run / "run.json").read_text())
    dlite = dlite_checkpoint(tmp_path / "dlite", TargetModel.load(str(tiny_qwen3_dir)))

    runner = Runner(config_for(tiny_qwen3_dir, finished_run, ["ngram", "ar", "dlite"], drafters={"dlite": str(dlite)}),
                    finished_run)
    runner.load()
    units = runner.pending_units()
    assert [u.methods for u in units] == [("ar", "dlite")] * 2  # ar only for the pairing; ngram not at all
    assert decoded_methods(runner) == {"dlite"}  # recorded: dlite; ar ran for pairing but is stored already

    assert rows(finished_run, ["ngram", "ar"]) == before
    turns = load_turns(finished_run)
    stored = turns[turns.method.isin(["ngram", "ar"])].sort_values(["method", "sample_id", "turn"])
    frame_before = frame_before.sort_values(["method", "sample_id", "turn"])
    assert stored.decode_s.tolist() == frame_before.decode_s.tolist()  # the very same rows, timings included
    assert not turns.duplicated(["method", "sample_id", "turn"]).any()
    ar = turns[turns.method == "ar"].set_index(["sample_id", "turn"]).output_ids
    for row in turns[turns.method == "dlite"].itertuples():  # lossless, and paired with a fresh ar decode
        assert list(row.output_ids) == list(ar[(row.sample_id, row.turn)]) and row.ar_decode_s > 0

    config = json.loads((finished_run / "run.json").read_text())
    assert config["environment"] == config_before["environment"]
    assert config["methods"] == ["ngram", "ar", "dlite"]
    assert config["drafter_sha256"]["dlite"] and config["drafters"]["dlite"]["checkpoint_sha256"]
    assert [r["added_methods"] for r in config["resumes"]] == [["dlite"]]
    assert config["resumes"][0]["environment"]["started_at"]
    assert len(list((finished_run / "turns.parquet").glob("*.parquet"))) == 1  # compacted again once finished


class Interrupt(Exception):
    pass


def test_an_interrupt_after_the_second_turn_keeps_it_and_resume_decodes_only_the_rest(tiny_qwen3_dir, tmp_path):
    """A four-turn conversation in free replay (each turn's context holds the model's earlier replies): stop after
    the second turn, then resume."""
    messages = [m for i in range(4) for m in ({"role": "user", "content": f"Count to {i + 3}."},
                                              {"role": "assistant", "content": "1 2 3"})]
    data = tmp_path / "four.jsonl"
    data.write_text(json.dumps({"id": "four", "messages": messages}) + "\n")
    common = dict(methods=["ngram", "ar"], task="custom", data_path=str(data), target=str(tiny_qwen3_dir),
                  max_new_tokens=12, k=4, resume=True, replay="free")
    reference = tmp_path / "reference"
    uninterrupted = Runner(RunConfig(**common, out=str(reference)), reference)
    uninterrupted.load()
    uninterrupted.run()

    out = tmp_path / "interrupted"
    runner = Runner(RunConfig(**common, out=str(out)), out)
    runner.load()

    def stop_after_second_turn(info):
        if info["turn"] == 1:
            raise Interrupt

    with pytest.raises(Interrupt):
        runner.run(Progress(total=0, update=stop_after_second_turn))
    kept = load_turns(out)
    assert sorted(set(kept.turn)) == [0, 1] and set(kept.method) == {"ngram", "ar"}

    resumed = Runner(RunConfig(**common, out=str(out)), out)
    resumed.load()
    decoded = []
    resumed.run(Progress(total=0, update=lambda info: decoded.append((info["method"], info["turn"]))))
    assert sorted(decoded) == sorted((m, t) for m in ("ngram", "ar") for t in (2, 3))  # only the rest
    assert rows(out) == rows(reference)


def test_every_reader_ignores_an_orphaned_part_and_resume_cleans_it(finished_run, tiny_qwen3_dir):
    """Killed between the renames of one turn: a steps part landed without its turns part (an orphan)."""
    reference_steps, reference_turns = load_steps(finished_run), load_turns(finished_run)
    (compacted,) = (finished_run / "steps.parquet").glob("*.parquet")
    orphan = finished_run / "steps.parquet" / "0123456789abcdef.parquet"
    orphan.write_bytes(compacted.read_bytes())  # rows that would double every step if a reader took them
    temporary = finished_run / "turns.parquet" / ".0123456789abcdef.parquet.tmp"
    temporary.write_bytes(b"half a file")
    store = RunStore(finished_run)
    assert {p.name for p in store.leftovers()} == {orphan.name, temporary.name}
    assert len(read_run(finished_run).steps) == len(reference_steps)  # the store's reader (resume, summary)
    report = load_results([finished_run])  # the report's reader
    assert len(report.steps) == len(reference_steps) and len(report.turns) == len(reference_turns)
    runner = Runner(config_for(tiny_qwen3_dir, finished_run, ["ngram", "ar"]), finished_run)
    runner.load()
    assert store.leftovers() == [] and runner.pending_units() == []


def test_a_stored_turn_is_never_rewritten(finished_run):
    from evalsuite.store.records import TurnRecord

    row = read_run(finished_run).turns.iloc[0]
    record = TurnRecord(**{k: row[k] for k in TurnRecord.__dataclass_fields__})
    with pytest.raises(RuntimeError, match="already stored"):
        RunStore(finished_run).write_turn(record.sample_id, record.turn, [], [record])


def test_workers_preparing_one_store_at_once_do_not_trip_over_each_other(tmp_path):
    """Ray workers all prepare the run's store as they start (a CI run once failed with 'not writable (No such file or
    directory)' when one worker removed the write probe another had just made)."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    barrier = Barrier(8)

    def prepare_often(_):
        barrier.wait()
        for _ in range(200):
            RunStore(tmp_path / "shared").prepare()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(prepare_often, range(8)))  # re-raises the first worker's error
    assert not [p.name for p in (tmp_path / "shared").iterdir() if p.name.startswith(".write-test")]


@pytest.mark.parametrize("change, field", [
    (["--limit", "1"], "sample_ids"),
    (["--max-turns", "1"], "max_turns"),
    (["--weight-layout", "row-major"], "weight_layout"),
    (["--threads", "2"], "threads"),
    (["--seed", "3"], "seed"),
])
def test_resume_refuses_each_drift_field_by_name(finished_run, tiny_qwen3_dir, change, field):
    args = base_args(tiny_qwen3_dir, finished_run)
    if change[0] == "--limit":
        args[args.index("--limit") + 1] = change[1]
        change = []
    if field == "threads":  # a count other than the one the run was timed with (auto resolved it to free cores)
        stored = json.loads((finished_run / "run.json").read_text())["threads"]
        change = ["--threads", str(stored + 1)]
    before = rows(finished_run)
    try:
        result = run_cli(*args, *change, "--resume")
    finally:
        torch.set_num_threads(1)
    assert result.exit_code == 2 and "Traceback" not in result.output
    # one line (after the transformers weight-loading bar, which is not ours)
    assert result.output.strip().splitlines()[-1].startswith(f"error: --resume: {field} differs from the stored run")
    assert rows(finished_run) == before


def test_resume_with_auto_threads_keeps_the_stored_count(finished_run, tiny_qwen3_dir):
    """--threads auto on resume: the count the run was timed with, not whatever the machine leaves free now."""
    config = json.loads((finished_run / "run.json").read_text())
    config["threads"] = config["threads"] + 1  # as if the first part ran when one more core was free
    (finished_run / "run.json").write_text(json.dumps(config))
    try:
        result = run_cli(*base_args(tiny_qwen3_dir, finished_run), "--resume")
    finally:
        torch.set_num_threads(1)
    assert result.exit_code == 0, result.output
    assert json.loads((finished_run / "run.json").read_text())["threads"] == config["threads"]


def test_sample_ids_select_exact_samples_and_are_a_drift_field(tiny_qwen3_dir, tmp_path):
    out = tmp_path / "ids"
    args = ["run", "--method", "ngram", "--task", "mt-bench", "--target", str(tiny_qwen3_dir), "--max-new-tokens",
            "8", "--out", str(out)]
    result = run_cli(*args, "--sample-ids", "mt-bench-125,mt-bench-81")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "run.json").read_text())["sample_ids"] == ["mt-bench-125", "mt-bench-81"]
    assert set(load_turns(out).sample_id) == {"mt-bench-125", "mt-bench-81"}
    # the same samples in another order are the same selection; another sample is drift
    assert run_cli(*args, "--sample-ids", "mt-bench-81,mt-bench-125", "--resume").exit_code == 0
    result = run_cli(*args, "--sample-ids", "mt-bench-81", "--resume")
    assert result.exit_code == 2 and "sample_ids differs" in result.output


@pytest.mark.parametrize("value, message", [
    ("mt-bench-125,nosuch", "--sample-ids: nosuch not in task mt-bench"),
    ("mt-bench-125,mt-bench-125", "--sample-ids: mt-bench-125 given more than once"),
    (",", "--sample-ids: name at least one sample id"),
])
def test_bad_sample_ids_are_one_line_errors(tiny_qwen3_dir, tmp_path, value, message):
    result = run_cli("run", "--task", "mt-bench", "--target", str(tiny_qwen3_dir), "--out", str(tmp_path / "x"),
                     "--sample-ids", value)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1].startswith(f"error: {message}")  # after the weight-loading bar


def test_sample_ids_with_limit_is_refused(tiny_qwen3_dir, tmp_path):
    result = run_cli("run", "--task", "mt-bench", "--target", str(tiny_qwen3_dir), "--out", str(tmp_path / "x"),
                     "--sample-ids", "mt-bench-125", "--limit", "2")
    assert result.exit_code == 2 and "--sample-ids and --limit" in result.output


def test_data_path_content_is_a_drift_field(tiny_qwen3_dir, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "Count to five."}]}) + "\n")
    out = tmp_path / "custom"
    args = ["run", "--method", "ngram", "--task", "custom", "--data-path", str(data), "--target", str(tiny_qwen3_dir),
            "--max-new-tokens", "8", "--out", str(out)]
    assert run_cli(*args).exit_code == 0
    stored = json.loads((out / "run.json").read_text())["data_sha256"]
    assert stored == hashlib.sha256(data.read_bytes()).hexdigest()
    data.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "Count to six."}]}) + "\n")
    result = run_cli(*args, "--resume")
    assert result.exit_code == 2 and "data_sha256 differs from the stored run" in result.output


def test_threads_are_set_and_recorded(tiny_qwen3_dir, tmp_path):
    out = tmp_path / "threads"
    try:
        result = run_cli("run", "--method", "ngram", "--task", "mt-bench", "--target", str(tiny_qwen3_dir),
                         "--limit", "1", "--max-new-tokens", "4", "--threads", "2", "--out", str(out))
        assert result.exit_code == 0, result.output
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
    assert json.loads((out / "run.json").read_text())["threads"] == 2


def test_plan_is_printed_before_the_run(tiny_qwen3_dir, tmp_path):
    result = run_cli(*base_args(tiny_qwen3_dir, tmp_path / "plan"))
    assert result.exit_code == 0, result.output
    plan = " ".join(result.output.split())
    assert "plan: 2 of 2 samples to run, 4 turns in all (2 + 2); 8 turn decodes over 2 methods (ar, ngram), " \
           "up to 24 new tokens each" in plan and "estimated" in plan
    result = run_cli(*base_args(tiny_qwen3_dir, tmp_path / "plan"), "--resume")
    assert "0 of 2 samples to run" in " ".join(result.output.split())


def test_an_interrupt_prints_the_exact_command_to_continue(tiny_qwen3_dir, tmp_path, monkeypatch):
    original = Runner.run

    def interrupted(self, progress=None):
        def stop(info):
            raise KeyboardInterrupt  # Ctrl-C once the first turn is stored

        return original(self, Progress(0, stop))

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Runner, "run", interrupted)
    args = ["run", "--method", "ngram", "--task", "mt-bench", "--target", str(tiny_qwen3_dir), "--limit", "1"]
    monkeypatch.setattr(sys, "argv", ["evalsuite", *args])
    result = cli.invoke(app, args)
    assert result.exit_code == 130
    (run_dir,) = (tmp_path / "results").iterdir()  # the default --out has a timestamp
    command = result.output.strip().splitlines()[-1]
    assert command == (f"evalsuite run --method ngram --task mt-bench --target {tiny_qwen3_dir} --limit 1 "
                       f"--out results/{run_dir.name} --resume")


# ---- pure pieces ------------------------------------------------------------------------------------------------
STORED = {"methods": ["dspark", "ar"], "k": 4, "tokenizer_sha256": "a", "threads": 1, "sample_ids": ["x", "y"],
          "method_options": {"dspark": {"confidence_threshold": 0.5}}, "drafter_sha256": {"dspark": "d", "ar": None},
          "drafters": {"dspark": {"checkpoint_sha256": "d"}, "ar": {}}, "environment": {"started_at": "first"}}


@pytest.mark.parametrize("change, line", [
    ({"tokenizer_sha256": "b"}, "tokenizer_sha256 differs from the stored run ('a' → 'b')"),
    ({"threads": 4}, "threads differs"),
    ({"sample_ids": ["x"]}, "sample_ids differs"),
    ({"method_options": {}}, "method_options of method dspark differs"),
    ({"method_options": {"dspark": {"confidence_threshold": 0.7}}}, "method_options of method dspark differs"),
    ({"drafter_sha256": {"dspark": "e", "ar": None}}, "drafter_sha256 of method dspark differs"),
])
def test_differences_name_the_field(change, line):
    assert differences(STORED, {**STORED, **change})[0].startswith(line)


def test_added_methods_join_the_stored_config_and_the_environment_is_kept():
    current = {**STORED, "methods": ["ngram", "ar"], "drafter_sha256": {"ngram": None, "ar": None},
               "drafters": {"ngram": {"max_ngram": 3}, "ar": {}}, "method_options": {},
               "environment": {"started_at": "second"}, "sample_ids": ["y", "x"]}
    assert differences(STORED, current) == []  # shared method ar agrees; the order of the ids does not matter
    merged = resumed_config(STORED, current)
    assert merged["methods"] == ["dspark", "ar", "ngram"]
    assert merged["drafters"] == {"dspark": {"checkpoint_sha256": "d"}, "ar": {}, "ngram": {"max_ngram": 3}}
    assert merged["environment"] == {"started_at": "first"}
    assert merged["resumes"] == [{"methods": ["ngram", "ar"], "added_methods": ["ngram"],
                                  "environment": {"started_at": "second"}}]
    again = resumed_config(merged, {**current, "environment": {"started_at": "third"}})
    assert [r["environment"]["started_at"] for r in again["resumes"]] == ["second", "third"]


def test_resume_command_names_the_directory_and_the_program_as_invoked(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["evalsuite"])
    argv = ["run", "--method", "ngram", "--out=results/x-1", "--limit", "3", "--task", "mt bench"]
    assert resume_command(argv, Path("results/x-1")) == \
        "evalsuite run --method ngram --limit 3 --task 'mt bench' --out results/x-1 --resume"
    assert resume_command(["run", "--resume", "--out", "a"], Path("a")) == "evalsuite run --out a --resume"
    assert resume_command(["run"], Path("results/gsm8k-ar-20260101")) == \
        "evalsuite run --out results/gsm8k-ar-20260101 --resume"
    monkeypatch.setattr(sys, "argv", [".venv/bin/evalsuite"])  # as the README's quick start runs it
    assert resume_command(["run"], Path("a")) == ".venv/bin/evalsuite run --out a --resume"
    monkeypatch.setattr(sys, "argv", ["/x/evalsuite/cli.py"])  # python -m evalsuite.cli
    assert resume_command(["run"], Path("a")) == f"{shlex.quote(sys.executable)} -m evalsuite.cli run --out a --resume"


def test_a_run_json_without_finished_pairs_may_be_started_over(tmp_path, tiny_qwen3_dir):
    """A run killed before its first pair finished holds only run.json: a plain rerun may start over."""
    out = tmp_path / "empty"
    RunStore(out).prepare()
    RunStore(out).write_config({"k": 99})
    result = run_cli(*base_args(tiny_qwen3_dir, out))
    assert result.exit_code == 0, result.output
    assert json.loads((out / "run.json").read_text())["k"] == 4


# ---- SIGKILL at random points, then --resume (the real CLI in subprocesses) -------------------------------------
@pytest.fixture(scope="module")
def kill_resume_script():
    return load_script(SCRIPT, "kill_resume")


def _kill_resume(module, target_dir, tmp_path, kills: int, max_new_tokens: int):
    outcome = module.main(["--kills", str(kills), "--seed", "0", "--target", str(target_dir), "--max-new-tokens",
                           str(max_new_tokens), "--work", str(tmp_path)])
    assert outcome.kills == kills and len(outcome.pairs_at_kill) == kills
    assert outcome.reference_rows > 0
    assert (outcome.rows_lost, outcome.rows_duplicated, outcome.rows_extra, outcome.rows_differing,
            outcome.leftovers) == (0, 0, 0, 0, 0), outcome.describe()
    return outcome


def test_sigkill_at_a_few_random_points_then_resume(kill_resume_script, tiny_llama_dir, tmp_path):
    _kill_resume(kill_resume_script, tiny_llama_dir, tmp_path, kills=2, max_new_tokens=48)


@pytest.mark.integration
def test_sigkill_at_20_random_points_then_resume(kill_resume_script, tiny_llama_dir, tmp_path):
    outcome = _kill_resume(kill_resume_script, tiny_llama_dir, tmp_path, kills=20, max_new_tokens=64)
    assert max(outcome.pairs_at_kill) > 0  # some kills landed after pairs had finished, mid-run


def test_auto_threads_records_the_measured_choice_and_a_resume_keeps_it(tiny_qwen3_dir, tmp_path, monkeypatch):
    """--threads auto on a machine with two free cores: both counts are timed, the faster kept, the measurement
    written to run.json; the resume keeps the count and the stored measurement."""
    from evalsuite import contention

    monkeypatch.setattr(contention, "resolve_threads", lambda requested, snap: 2 if requested in (None, "auto")
                        else int(requested))
    out = tmp_path / "auto"
    try:
        args = ["run", "--method", "ngram", "--task", "mt-bench", "--target", str(tiny_qwen3_dir), "--limit", "1",
                "--max-new-tokens", "8", "--out", str(out)]
        assert run_cli(*args).exit_code == 0
        config = json.loads((out / "run.json").read_text())
        choice = config["contention"]["threads_choice"]
        assert set(choice["candidates"]) == {"1", "2"} and choice["chosen"] in (1, 2)
        assert config["threads"] == choice["chosen"]
        measured = {t: sum(v.values()) for t, v in choice["candidates"].items()}
        assert measured[str(choice["chosen"])] == min(measured.values())  # the faster one, by its own numbers
        assert all(set(v) == {"decode_ms", f"verify{config['k'] + 1}_ms"} for v in choice["candidates"].values())
        assert run_cli(*args, "--resume").exit_code == 0
        again = json.loads((out / "run.json").read_text())
        assert again["threads"] == config["threads"] and again["contention"]["threads_choice"] == choice
    finally:
        torch.set_num_threads(1)


def test_auto_threads_are_remembered_so_two_runs_of_one_machine_merge(tiny_qwen3_dir, tmp_path, monkeypatch):
    """A second --threads auto run of the same set-up reuses the first one's measured choice (and says so), even
    when a new measurement would choose the other count, so the two runs can be reported together."""
    from evalsuite import contention
    from evalsuite.engines import hf

    monkeypatch.setenv("EVALSUITE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(contention, "resolve_threads", lambda requested, snap: 2 if requested in (None, "auto")
                        else int(requested))
    calls = []
    measure = hf.HfEngine._measure_threads

    def flip(self, candidates):  # the first measurement as measured; any later one would pick the other count
        choice = measure(self, candidates)
        if calls:
            choice = {**choice, "chosen": 3 - calls[0]}
        calls.append(choice["chosen"])
        return choice

    monkeypatch.setattr(hf.HfEngine, "_measure_threads", flip)
    try:
        configs = []
        for task in ("gsm8k", "mt-bench"):
            out = tmp_path / task
            assert run_cli("run", "--method", "ngram", "--task", task, "--target", str(tiny_qwen3_dir), "--limit",
                           "1", "--max-new-tokens", "4", "--out", str(out)).exit_code == 0
            configs.append(json.loads((out / "run.json").read_text()))
        assert len(calls) == 1  # measured once
        first, second = (c["contention"]["threads_choice"] for c in configs)
        assert first["source"] == "measured in this run" and second["source"].startswith("remembered: measured ")
        assert first["candidates"] == second["candidates"] and configs[0]["threads"] == configs[1]["threads"]
        report = run_cli("report", str(tmp_path / "gsm8k"), str(tmp_path / "mt-bench"), "--out",
                         str(tmp_path / "report"), "--resamples", "100")
        assert report.exit_code == 0, report.output
    finally:
        torch.set_num_threads(1)


def test_auto_weight_layout_records_its_measurement_and_a_resume_keeps_the_layout(tiny_qwen3_dir, tmp_path,
                                                                                   monkeypatch):
    """--weight-layout auto: run.json names the kernels chosen (fused or fused+onednn) with the measurement behind
    them; a resume keeps that layout even where this machine would now choose the other (the cache of choices
    gone, a new measurement flipped), so one run is never timed on two kernels."""
    from evalsuite.target.decoder import FusedDecoder

    monkeypatch.setenv("EVALSUITE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    args = ["run", "--method", "ngram", "--task", "mt-bench", "--target", str(tiny_qwen3_dir), "--limit", "2",
            "--max-new-tokens", "8", "--threads", "1", "--out", str(out)]
    assert run_cli(*args).exit_code == 0
    config = json.loads((out / "run.json").read_text())
    choice = config["weight_layout_choice"]
    assert config["weight_layout"] == {"mkl": "fused", "onednn": "fused+onednn", "panel": "fused+panel"}[choice["chosen"]]
    assert set(choice["candidates"]) == {"mkl", "onednn", "panel"} and choice["rule"].startswith("lowest decode + verify-8")
    other = "mkl" if choice["chosen"] == "onednn" else "onednn"
    monkeypatch.setenv("EVALSUITE_CACHE", str(tmp_path / "cache2"))
    monkeypatch.setattr(FusedDecoder, "measure_products", lambda self, rows, candidates: {
        other: {"decode_ms": 1.0, f"verify{rows}_ms": 1.0}, choice["chosen"]: {"decode_ms": 9.0, f"verify{rows}_ms": 9.0}})
    fresh = tmp_path / "fresh"
    assert run_cli(*args[:-1], str(fresh)).exit_code == 0  # a new run here would now choose the other kernels
    assert json.loads((fresh / "run.json").read_text())["weight_layout_choice"]["chosen"] == other
    assert run_cli(*args, "--resume").exit_code == 0
    again = json.loads((out / "run.json").read_text())
    assert again["weight_layout"] == config["weight_layout"]


def test_a_resume_keeps_the_attention_lane_form_of_its_first_part(tiny_qwen3_dir, tmp_path, monkeypatch):
    """run.json records the CPU attention's lane form for verify blocks and why (measured or remembered); a resume
    sets the recorded form again instead of choosing anew, so one run's turns are timed on one form."""
    from evalsuite.target import cpu_kernels

    if not cpu_kernels.available():
        pytest.skip(f"CPU kernels unavailable: {cpu_kernels.reason()}")
    measured = {"candidates": {"8": 1.0, "16": 2.0}, "chosen": 8, "rule": "planted", "source": "measured in this run"}
    monkeypatch.setattr(cpu_kernels, "choose_attention_lanes", lambda *args, **kwargs: measured)
    out = tmp_path / "run"
    args = ["run", "--method", "ngram", "--task", "mt-bench", "--target", str(tiny_qwen3_dir), "--limit", "2",
            "--max-new-tokens", "8", "--threads", "1", "--weight-layout", "fused+panel", "--out", str(out)]
    assert run_cli(*args).exit_code == 0
    assert json.loads((out / "run.json").read_text())["attention_lanes_choice"] == measured

    def choose_again(*args, **kwargs):
        raise AssertionError("a resumed run chose the lane form again")
    set_to, set_lanes = [], cpu_kernels.attention_lanes
    monkeypatch.setattr(cpu_kernels, "choose_attention_lanes", choose_again)
    monkeypatch.setattr(cpu_kernels, "attention_lanes", lambda lanes=0: set_to.append(lanes) or set_lanes(lanes))
    assert run_cli(*args, "--resume").exit_code == 0
    assert set_to[0] == 8  # the recorded form, set again before any turn
    assert json.loads((out / "run.json").read_text())["attention_lanes_choice"] == measured  # the record stands
