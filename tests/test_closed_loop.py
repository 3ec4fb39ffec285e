"""`--replay closed` driven by the runner: every decode of the agent loop is one recorded turn; calls parsed from
the replies are executed against bfcl-eval's real backends and their results are the next turn's context; at T=0
one loop led by `ar` is replayed for every method (and every method's reply is checked against `ar`'s), at T>0 each
method runs its own loop and pairing is by turn index only; the tool_calls table records what ran; resume replays
the stored turns (re-executing their calls) and ends as an uninterrupted run.

The tiny random target cannot write calls, so `PlantedEngine` (the real engine) replaces the output of the first
decodes of each trajectory with planted replies; later decodes are the target's own."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evalsuite.config import RunConfig
from evalsuite.engines.hf import HfEngine
from evalsuite.replay import Window, make_policy
from evalsuite.report.load import load_results
from evalsuite.run.runner import Progress, Runner
from evalsuite.store.run_store import read_run
from evalsuite.target.model import load_chat
from evalsuite.tasks import LoadOptions, get_task
from evalsuite.tasks.base import DATA_DIR
from evalsuite.testing import build_tiny_target

pytest.importorskip("bfcl_eval.eval_checker.multi_turn_eval.func_source_code.gorilla_file_system")
from evalsuite.replay.closed import closed_replays, read_tool_calls  # noqa: E402
from evalsuite.tasks.bfcl_v3.environment import BfclEnvironment  # noqa: E402

FUNCTIONS = ("cd", "ls", "mkdir", "mv", "pwd")
MOVE = "[cd(folder='document'), mkdir(dir_name='temp'), mv(source='final_report.pdf', destination='temp')]"
MALFORMED = "[cd(folder=temp)]"
PLAN = [MOVE, MALFORMED, "The report is in temp now.", "[cd(folder='temp'), ls()]"]


def small_bfcl(root: Path) -> Path:
    """BFCL's data layout with one bundled sample (multi_turn_base_0) on the file system only, five of its
    functions documented (no ground truth: the closed loop does not read it): the closed loop's system prompt then
    fits a tiny target's window."""
    source = DATA_DIR / "bfcl_v3"
    row = next(json.loads(line) for line in (source / "BFCL_v3_multi_turn_base.json").read_text().splitlines()
               if '"multi_turn_base_0"' in line)
    row = {**row, "involved_classes": ["GorillaFileSystem"],
           "initial_config": {"GorillaFileSystem": row["initial_config"]["GorillaFileSystem"]}}
    answer = json.dumps({"id": row["id"], "ground_truth": [[] for _ in row["question"]]})
    docs = [line for line in (source / "multi_turn_func_doc" / "gorilla_file_system.json").read_text().splitlines()
            if line.strip() and json.loads(line)["name"] in FUNCTIONS]
    (root / "possible_answer").mkdir(parents=True)
    (root / "multi_turn_func_doc").mkdir()
    (root / "BFCL_v3_multi_turn_base.json").write_text(json.dumps(row) + "\n")
    (root / "possible_answer" / "BFCL_v3_multi_turn_base.json").write_text(answer + "\n")
    (root / "multi_turn_func_doc" / "gorilla_file_system.json").write_text("\n".join(docs) + "\n")
    return root


@pytest.fixture(scope="module")
def bfcl_dir(tmp_path_factory) -> Path:
    return small_bfcl(tmp_path_factory.mktemp("bfcl-small"))


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return build_tiny_target(tmp_path_factory.mktemp("tiny-8k"), "llama", max_positions=8192)


class PlantedEngine(HfEngine):
    """The real engine, except that decode n of a method in a trajectory returns `plans[method][n]` when there is
    one (decoded for real first, so the turn keeps its steps and timings). Keeps every context it was given."""

    def __init__(self, config: RunConfig, plans: dict[str, list[str]], stop_after: int | None = None):
        super().__init__(config)
        self.plans, self.stop_after = plans, stop_after
        self.count: dict[str, int] = {}
        self.seen: list[tuple[str, int, str]] = []  # (method, decode n, context text)

    def begin_trajectory(self) -> None:
        super().begin_trajectory()
        self.count = {}

    def decode(self, method, ids, seed, on_step=None):
        n = self.count.get(method, 0)
        self.count[method] = n + 1
        self.seen.append((method, n, self.chat.tokenizer.decode(ids)))
        result = super().decode(method, ids, seed, on_step)
        plan = self.plans.get(method, [])
        if n < len(plan):
            result = replace(result, output_ids=self.chat.tokenizer(plan[n], add_special_tokens=False)["input_ids"])
        return result


def closed_config(target_dir, bfcl_dir, out, **changes) -> RunConfig:
    return RunConfig(**{**dict(methods=["ar", "ngram"], task="bfcl-v3", replay="closed", target=str(target_dir),
                                data_path=str(bfcl_dir), max_new_tokens=8, k=3, max_turns=6, warmup=False,
                                out=str(out)), **changes})


def run_closed(config: RunConfig, out: Path, plans, progress: Progress | None = None) -> PlantedEngine:
    engine = PlantedEngine(config, plans)
    runner = Runner(config, out, engine)
    runner.load()
    runner.run(progress)
    return engine


@pytest.fixture(scope="module")
def t0_run(target_dir, bfcl_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("closed") / "t0"
    engine = run_closed(closed_config(target_dir, bfcl_dir, out), out, {"ar": PLAN, "ngram": PLAN})
    return out, engine


def test_calls_are_executed_and_their_results_are_the_next_turns_context(t0_run):
    out, engine = t0_run
    contexts = {n: text for method, n, text in engine.seen if method == "ar"}
    assert "Move 'final_report.pdf' within document directory" in contexts[0]
    assert MOVE in contexts[1]  # the target's own reply, then what the real backend returned for it
    assert '"result": "\'final_report.pdf\' moved to \'temp/final_report.pdf\'"' in contexts[1]
    assert '{"current_working_directory": "document"}' in contexts[1]
    # a malformed call is an error observation in the next context, and the loop goes on
    assert "the function calls could not be parsed" in contexts[2] and "not a literal" in contexts[2]
    # no call: the user turn is over; the next decode starts user turn 1 with its question
    assert "Perform a detailed search using grep" in contexts[3]
    assert "Perform a detailed search using grep" not in contexts[2]
    # the backend kept its state across user turns: `ls` in temp shows the moved file
    assert '{"current_directory_content": ["final_report.pdf"]}' in contexts[4]


def test_the_tool_calls_table_records_each_turn(t0_run):
    out, _ = t0_run
    tools = read_tool_calls(out).sort_values(["method", "turn"])
    ar = tools[tools.method == "ar"]
    assert list(ar.turn) == [0, 1, 2, 3, 4, 5] and list(ar.user_turn[:5]) == [0, 0, 0, 1, 1]
    assert list(ar.step[:5]) == [0, 1, 2, 0, 1]
    first = ar.iloc[0]
    assert list(first.calls) == ["cd(folder='document')", "mkdir(dir_name='temp')",
                                 "mv(source='final_report.pdf', destination='temp')"]
    assert all(b > 0 for b in first.result_bytes) and list(first.errors) == ["", "", ""] and first.stop == ""
    malformed = ar.iloc[1]
    assert list(malformed.calls) == [] and "not a literal" in malformed.parse_error
    assert ar.iloc[2].stop == "no_calls" and list(ar.iloc[3].calls) == ["cd(folder='temp')", "ls()"]
    assert ar.iloc[5].stop in ("max_turns", "no_calls", "step_limit")  # --max-turns 6 caps the decodes
    assert set(tools.loop) == {"shared"}
    assert ar.matches_ar.isna().all()  # ar is not compared with itself
    ngram = tools[tools.method == "ngram"]
    assert ngram.matches_ar.tolist() == [True] * 6
    for column in ("user_turn", "step", "stop", "parse_error"):  # one loop: the same calls for both
        assert ngram[column].tolist() == ar[column].tolist()


def test_ar_and_ngram_outputs_are_identical_at_t0(t0_run):
    out, _ = t0_run
    tables = read_run(out)
    turns = tables.turns
    assert set(turns.replay) == {"closed"} and set(turns.pairing) == {""}
    ar = turns[turns.method == "ar"].set_index("turn").sort_index()
    ngram = turns[turns.method == "ngram"].set_index("turn").sort_index()
    assert sorted(ar.index) == sorted(ngram.index) == [0, 1, 2, 3, 4, 5]
    for turn in ar.index:  # planted replies for 0-3, the target's own output after them
        assert list(ar.output_ids[turn]) == list(ngram.output_ids[turn])
        assert ngram.context_len[turn] == ar.context_len[turn] and ngram.ar_decode_s[turn] == ar.decode_s[turn]
    assert list(ar["last"]) == [False] * 5 + [True]
    assert tables.config["closed_loop"]["loop"] == "shared" and tables.config["closed_loop"]["step_limit"] == 20


def test_at_t_above_0_each_method_runs_its_own_loop_and_pairs_by_turn_index(target_dir, bfcl_dir, tmp_path):
    out = tmp_path / "t1"
    plans = {"ar": ["[pwd()]", "[ls()]", "Done."], "ngram": ["Done."]}
    run_closed(closed_config(target_dir, bfcl_dir, out, temperature=1.0, max_turns=3), out, plans)
    tables = read_run(out)
    assert "turn index only" in tables.config["closed_loop"]["pairing"]
    turns = tables.turns
    assert set(turns.pairing) == {"turn_index"}
    tools = read_tool_calls(out)
    assert set(tools.loop) == {"own"} and tools.matches_ar.isna().all()
    where = {(r.method, r.turn): (r.user_turn, r.step) for r in tools.itertuples()}
    assert [where[("ar", t)] for t in range(3)] == [(0, 0), (0, 1), (0, 2)]
    assert where[("ngram", 0)] == (0, 0) and where[("ngram", 1)] == (1, 0)  # its own loop moved on
    ngram = turns[turns.method == "ngram"].set_index("turn")
    assert ngram.ar_decode_s[1] > 0  # paired with ar's turn 1, a different context
    assert any("paired with ar by turn index only" in note for note in load_results([out]).notes)


class Interrupt(Exception):
    pass


def test_an_interrupted_closed_run_resumes_to_the_same_rows(target_dir, bfcl_dir, tmp_path):
    plans = {"ar": PLAN, "ngram": PLAN}
    reference = tmp_path / "reference"
    run_closed(closed_config(target_dir, bfcl_dir, reference, resume=True), reference, plans)

    out = tmp_path / "interrupted"

    def stop(info):
        if info["turn"] == 1:  # raised after turn 1 is stored
            raise Interrupt

    with pytest.raises(Interrupt):
        run_closed(closed_config(target_dir, bfcl_dir, out, resume=True), out, plans, Progress(0, stop))
    assert sorted(set(read_run(out).turns.turn)) == [0, 1]
    # the stored decodes are not decoded again (their replies are replayed, their calls re-executed): the resumed
    # engine's first decode is turn 2
    engine = PlantedEngine(closed_config(target_dir, bfcl_dir, out, resume=True), {m: PLAN[2:] for m in plans})
    runner = Runner(closed_config(target_dir, bfcl_dir, out, resume=True), out, engine)
    runner.load()
    runner.run()
    assert {n for _, n, _ in engine.seen} == {0, 1, 2, 3}  # four decodes per method: turns 2-5 only
    contexts = {n: text for method, n, text in engine.seen if method == "ar"}
    # the stored move was executed again on fresh backends: `ls` in temp still finds the file
    assert '{"current_directory_content": ["final_report.pdf"]}' in contexts[2]
    values = ["method", "turn", "context_len", "new_tokens", "output_ids", "last", "replay", "pairing"]

    def rows(run):
        turns = read_run(run).turns.sort_values(["method", "turn"])
        return [tuple(tuple(v) if hasattr(v, "__len__") and not isinstance(v, str) else v for v in row)
                for row in turns[values].itertuples(index=False)]

    assert rows(out) == rows(reference)
    tool_values = ["method", "turn", "user_turn", "step", "calls", "result_bytes", "errors", "stop", "matches_ar"]

    def tool_rows(run):
        tools = read_tool_calls(run).sort_values(["method", "turn"])
        return [tuple(tuple(v) if hasattr(v, "__len__") and not isinstance(v, str) else v for v in row)
                for row in tools[tool_values].itertuples(index=False)]

    assert tool_rows(out) == tool_rows(reference)


# ---- the session, without a model ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def session_parts(target_dir, bfcl_dir):
    chat = load_chat(str(target_dir))
    trajectory, = get_task("bfcl-v3").load(LoadOptions(data_path=str(bfcl_dir)))
    policy = make_policy("stop", Window(chat.max_context, 8, 3))
    return trajectory, policy, (lambda t: (lambda messages: chat.render(messages, t.tools))), chat


def test_a_mismatch_with_ar_is_recorded_and_the_loop_follows_ar(session_parts):
    trajectory, policy, render_for, chat = session_parts
    replays = closed_replays(trajectory, ("ar", "ngram"), policy, render_for, 0.0, environment=BfclEnvironment)
    ar, ngram = replays["ar"], replays["ngram"]
    assert ar.has_turn(0) and not ar.has_turn(1)
    assert ngram.context(0) is ar.context(0)
    ngram.record_reply(0, "[pwd()]")  # the follower replies first (turn order is shuffled): nothing runs yet
    assert not ar.has_turn(1)
    ar.record_reply(0, MOVE)
    assert ngram.has_turn(1) and ar.has_turn(1)
    assert ngram.turn_extra(0)["tool_calls"][0]["matches_ar"] is False
    assert len(ngram.turn_extra(0)["tool_calls"][0]["calls"]) == 3  # ar's calls ran, not ngram's
    assert "moved to" in chat.decode(ngram.context(1).ids)


def test_a_skipped_decode_leaves_one_skipped_turn_per_remaining_user_turn(session_parts):
    trajectory, policy, render_for, _ = session_parts
    replay = closed_replays(trajectory, ("ar",), policy, render_for, 0.0, environment=BfclEnvironment)["ar"]
    replay.context(0)
    replay.record_reply(0, "[pwd()]")
    replay.context(1)
    replay.record_reply(1, None)  # skipped (e.g. over the window)
    index, reasons = 2, []
    while replay.has_turn(index):
        context = replay.context(index)
        reasons.append(context.skip_reason)
        replay.record_reply(index, None)
        index += 1
    assert len(reasons) == len(trajectory.turns) - 1 and all("decode 1 (user turn 0) was skipped" in r
                                                             for r in reasons)
    assert replay.turn_extra(1)["tool_calls"][0]["stop"] == "skipped"


def test_the_step_limit_ends_the_user_turn(session_parts):
    trajectory, policy, render_for, _ = session_parts
    replay = closed_replays(trajectory, ("ar",), policy, render_for, 0.0,
                            environment=lambda t: BfclEnvironment(t, step_limit=2))["ar"]
    for index in range(2):
        replay.context(index)
        replay.record_reply(index, "[pwd()]")
    row = replay.turn_extra(1)["tool_calls"][0]
    assert (row["user_turn"], row["step"], row["stop"]) == (0, 1, "step_limit")
    assert replay.has_turn(2)
    replay.context(2)
    assert replay.session.where[2] == (1, 0)  # the next user turn


def test_runs_without_the_new_columns_still_read(tmp_path, t0_run):
    out, _ = t0_run
    old = tmp_path / "old"
    (old / "turns.parquet").mkdir(parents=True)
    (old / "steps.parquet").mkdir()
    (old / "run.json").write_text((out / "run.json").read_text())
    turns = pq.read_table(next((out / "turns.parquet").glob("*.parquet")))
    older = turns.drop_columns(["repo", "pairing"])
    pq.write_table(older, old / "turns.parquet" / "part.parquet")
    pq.write_table(pa.Table.from_pylist([], schema=pq.read_schema(next((out / "steps.parquet").glob("*.parquet")))),
                   old / "steps.parquet" / "part.parquet")
    read = read_run(old).turns
    assert len(read) == turns.num_rows and set(read.repo) == {""} and set(read.pairing) == {""}
    assert read_tool_calls(old).empty


def test_the_cli_plans_and_runs_a_closed_loop(target_dir, bfcl_dir, tmp_path):
    """`evalsuite run --replay closed` end to end: the plan counts one decode per user turn (placeholder replies
    call no tool, so nothing is executed for the plan), then the loop runs and stores its tool calls."""
    import torch
    from typer.testing import CliRunner

    from evalsuite.cli import app
    from evalsuite.run.plan import pending_turns

    out = tmp_path / "cli"
    try:
        result = CliRunner().invoke(app, ["run", "--method", "ngram", "--task", "bfcl-v3", "--replay", "closed",
                                          "--target", str(target_dir), "--data-path", str(bfcl_dir), "--limit", "1",
                                          "--max-new-tokens", "8", "--k", "3", "--max-turns", "3", "--threads", "1",
                                          "--out", str(out)], catch_exceptions=False)
    finally:
        torch.set_num_threads(1)
    assert result.exit_code == 0, result.output
    assert "plan:" in result.output and "Traceback" not in result.output
    turns = read_run(out).turns
    assert set(turns.method) == {"ar", "ngram"} and (turns.replay == "closed").all()
    assert len(read_tool_calls(out)) == len(turns)
    runner = Runner(closed_config(target_dir, bfcl_dir, tmp_path / "plan", max_turns=None, data_path=str(bfcl_dir)),
                    tmp_path / "plan")
    runner.load()
    unit = runner.pending_units()[0]
    planned = pending_turns(runner, unit)  # placeholder replies call nothing: one decode per user turn
    assert len(planned) == len(unit.trajectory.turns)
    assert all(set(methods) == {"ar", "ngram"} for _, _, methods in planned)
    contexts = [context for context, _, _ in planned]
    assert contexts == sorted(contexts)  # each user turn's context holds the one before
