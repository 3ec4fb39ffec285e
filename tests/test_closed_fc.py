"""`--replay closed --tool-format native`: the closed BFCL loop in the target's own tool-calling format.

A tiny random target gets a chat template that takes `tools` (written here, in the Hermes convention: tools in the
system block, `<tool_call>` JSON for calls, `tool` messages as `<tool_response>`), so the loop defaults to native;
`PlantedEngine` (the real engine, tests/test_closed_loop.py) plants native-format replies for the first decodes.
The calls run against bfcl-eval's real backends; refused and unparsable calls are error observations; BFCL's
state-based check scores the loop (a planted correct run solved, a wrong one not, agreeing with bfcl-eval's own
`multi_turn_checker` on the same calls); at T=0 a drafting method's replies and score equal ar's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evalsuite.config import RunConfig
from evalsuite.errors import UserError
from evalsuite.replay import Window, make_policy
from evalsuite.store.run_store import read_run
from evalsuite.tasks import LoadOptions, get_task
from evalsuite.testing import build_tiny_target

pytest.importorskip("bfcl_eval.eval_checker.multi_turn_eval.func_source_code.gorilla_file_system")
from evalsuite.replay.closed import NATIVE, PROMPT, closed_replays, read_tool_calls, resolve_tool_format  # noqa: E402
from evalsuite.tasks.bfcl_v3.environment import BfclEnvironment  # noqa: E402
from evalsuite.tasks.bfcl_v3.native_calls import ToolIndex, parse_native  # noqa: E402
from tests.test_closed_loop import PlantedEngine, closed_config, small_bfcl  # noqa: E402

TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "Functions you may call:\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "Call one with <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>.<|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and tools %}"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n{{ message.content }}"
    "{%- for call in message.tool_calls %}<tool_call>\n{\"name\": \"{{ call.function.name }}\", \"arguments\": "
    "{{ call.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


MOVE = "\n".join([call("cd", folder="document"), call("mkdir", dir_name="temp"),
                  call("mv", source="final_report.pdf", destination="temp")])
BAD = "\n".join([call("cd", folder=7), call("rm_rf", path="/"), '<tool_call>\n{"name": "ls", "arguments": {\n</tool_call>'])
PLAN = [MOVE, BAD, "The report is in temp now.", call("cd", folder="temp") + call("ls")]


@pytest.fixture(scope="module")
def bfcl_dir(tmp_path_factory) -> Path:
    return small_bfcl(tmp_path_factory.mktemp("bfcl-small"))


@pytest.fixture(scope="module")
def tools_target(tmp_path_factory) -> Path:
    from transformers import AutoTokenizer

    directory = build_tiny_target(tmp_path_factory.mktemp("tiny-tools"), "llama", max_positions=8192)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.chat_template = TOOLS_TEMPLATE
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def native_run(tools_target, bfcl_dir, tmp_path_factory):
    from evalsuite.run.runner import Runner

    out = tmp_path_factory.mktemp("closed-fc") / "t0"
    config = closed_config(tools_target, bfcl_dir, out)
    engine = PlantedEngine(config, {"ar": PLAN, "ngram": PLAN})
    runner = Runner(config, out, engine)
    runner.load()
    runner.run()
    return out, engine


# ---- parsing and the schema ---------------------------------------------------------------------------------------
def test_native_blocks_are_parsed_as_json_only():
    reply = parse_native("Sure.\n" + call("cd", folder="a") + '\n<tool_call>{"name": "ls", "arguments": "{\\"a\\": true}"}'
                         "</tool_call>")
    assert [(c.name, c.arguments) for c in reply.calls] == [("cd", {"folder": "a"}), ("ls", {"a": True})]
    assert reply.content == "Sure." and not reply.errors
    assert not parse_native("I moved it.").attempted and not parse_native("[cd(folder='a')]").attempted
    for text, reason in [('<tool_call>{"name": "cd", "arguments": {"folder": </tool_call>', "not JSON"),
                         ('<tool_call>{"name": "power", "arguments": {"base": NaN}}</tool_call>', "not JSON"),
                         ('<tool_call>["cd"]</tool_call>', 'needs a JSON object with a "name"'),
                         ('<tool_call>{"name": "cd", "arguments": [1]}</tool_call>', "must be a JSON object"),
                         ('<tool_call>{"name": "__import__(\'os\').system(\'x\')"}</tool_call>', None),
                         ('<tool_call>\n{"name": "cd", "arguments": {"folder": "a"}}', "never closed")]:
        parsed = parse_native(text)
        assert parsed.attempted
        if reason is None:  # a name is only ever looked up among the tools, never evaluated
            assert parsed.calls[0].name.startswith("__import__")
        else:
            assert parsed.calls == [] and reason in " ".join(parsed.errors)


def test_json_calls_in_a_fence_or_bare_are_calls_with_their_form():
    fenced = parse_native('```json\n{\n  "name": "cd",\n  "arguments": {"folder": "a"}\n}\n```')
    assert [(c.name, c.arguments, c.form) for c in fenced.calls] == [("cd", {"folder": "a"}, "fence")]
    bare = parse_native('[{"name": "cd", "arguments": {"folder": "a"}}, {"name": "ls", "arguments": {}}]')
    assert [(c.name, c.form) for c in bare.calls] == [("cd", "bare"), ("ls", "bare")]
    assert [c.form for c in parse_native(call("ls")).calls] == ["tag"]
    # several values one after another: the calls, up to the first value that is not one (a made-up tool response)
    chained = parse_native('{"name": "cd", "arguments": {"folder": "a"}}\n{"name": "ls", "arguments": {}}\n'
                           '{"response": {"current_working_directory": "a"}}\n{"name": "pwd", "arguments": {}}')
    assert [c.name for c in chained.calls] == ["cd", "ls"] and not chained.errors
    broken = parse_native('```json\n{"name": "cd", "arguments": {\n```')
    assert broken.attempted and "not valid JSON" in broken.errors[0]
    for text in ("```python\nprint(1)\n```", '```json\n{"answer": 3}\n```', "The answer is {x}."):
        assert not parse_native(text).attempted


def test_calls_are_checked_against_their_tools_schema():
    index = ToolIndex([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "required": ["a"], "properties": {
            "a": {"type": "integer"}, "b": {"type": "number"}, "c": {"type": "array", "items": {"type": "string"}},
            "d": {"type": "string", "enum": ["x", "y"]}, "e": {"type": "object", "properties": {
                "n": {"type": "boolean"}}}}}}}], {"f": "backend_f"})
    assert index.check("f", {"a": 1, "b": 2, "c": ["s"], "d": "x", "e": {"n": False}}) == ("backend_f", "")
    assert index.check("f", {"a": 1, "b": 2.5})[1] == ""
    for arguments, reason in [({}, "missing required argument 'a'"), ({"a": 1, "z": 1}, "unexpected argument 'z'"),
                              ({"a": "1"}, "'a' must be integer, got string"),
                              ({"a": True}, "'a' must be integer, got boolean"),
                              ({"a": 1.5}, "'a' must be integer, got number"),
                              ({"a": 1, "c": ["s", 2]}, "'c'[1] must be string"),
                              ({"a": 1, "d": "q"}, "must be one of"), ({"a": 1, "e": {"n": 1}}, "'e'.n must be boolean")]:
        assert reason in index.check("f", arguments)[1]
    assert "is not one of the provided functions" in index.check("g", {})[1]


def test_bfcl_types_become_json_schema_types():
    trajectory = get_task("bfcl-v3").load(LoadOptions())[0]
    kinds = {p.get("type") for t in trajectory.tools for p in t["function"]["parameters"]["properties"].values()}
    assert kinds <= {"string", "integer", "number", "boolean", "array", "object"}


def test_auto_is_native_where_the_template_takes_tools():
    assert resolve_tool_format(None, TOOLS_TEMPLATE) == NATIVE
    assert resolve_tool_format("auto", "{% for m in messages %}{{ m.content }}{% endfor %}") == PROMPT
    assert resolve_tool_format(PROMPT, TOOLS_TEMPLATE) == PROMPT


def test_tool_format_is_refused_off_the_closed_loop_and_checked():
    with pytest.raises(UserError, match="use it with --replay closed"):
        RunConfig(methods=["ar"], task="bfcl-v3", replay="logged", tool_format="native").validate()
    with pytest.raises(UserError, match="--tool-format nativ: choose from auto, native, prompt") as err:
        RunConfig(methods=["ar"], task="bfcl-v3", replay="closed", tool_format="nativ").validate()
    assert "\n" not in str(err.value)
    config = RunConfig(methods=["ar"], task="bfcl-v3", replay="closed", tool_format="auto")
    config.validate()
    assert config.tool_format is None


# ---- the loop on a tiny target --------------------------------------------------------------------------------
def test_native_calls_run_and_come_back_as_the_templates_tool_messages(native_run):
    out, engine = native_run
    contexts = {n: text for method, n, text in engine.seen if method == "ar"}
    assert '"function": {"name": "mkdir"' in contexts[0] and "Functions you may call:" in contexts[0]
    assert "You are an expert in composing functions" not in contexts[0]  # no prompting-mode system prompt
    # the reply as the template's assistant tool calls, then each result as the template's tool message
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "cd", "arguments": {"folder": "document"}}\n</tool_call>'
            in contexts[1])
    assert ('<|im_start|>user\n<tool_response>\n{"current_working_directory": "document"}\n</tool_response>'
            in contexts[1])
    assert '"result": "\'final_report.pdf\' moved to \'temp/final_report.pdf\'"' in contexts[1]
    # a wrong argument type, an unknown function and broken JSON: three error observations, nothing executed
    assert "Error: cd: argument 'folder' must be string, got integer" in contexts[2]
    assert "Error: 'rm_rf' is not one of the provided functions" in contexts[2]
    assert "Error: a <tool_call> block is not JSON" in contexts[2]
    assert "Perform a detailed search using grep" in contexts[3]  # no call: the next user turn
    # the refused cd(7) changed nothing: cd temp from document works, and the moved file is there
    assert '{"current_directory_content": ["final_report.pdf"]}' in contexts[4]


def test_the_tool_calls_table_records_executed_and_refused_calls(native_run):
    out, _ = native_run
    tools = read_tool_calls(out).sort_values(["method", "turn"])
    ar = tools[tools.method == "ar"].reset_index(drop=True)
    first, bad = ar.iloc[0], ar.iloc[1]
    assert list(first.calls) == ['cd({"folder": "document"})', 'mkdir({"dir_name": "temp"})',
                                 'mv({"source": "final_report.pdf", "destination": "temp"})']
    assert list(first.executed) == [True] * 3 and list(first.errors) == [""] * 3 and list(first.forms) == ["tag"] * 3
    assert all(b > 0 for b in first.result_bytes)
    assert list(bad.calls) == ['cd({"folder": 7})', 'rm_rf({"path": "/"})'] and list(bad.executed) == [False, False]
    assert "must be string" in bad.errors[0] and "not one of the provided functions" in bad.errors[1]
    assert "not JSON" in bad.parse_error
    assert list(ar.stop[:3]) == ["", "", "no_calls"] and list(ar.user_turn[:4]) == [0, 0, 0, 1]
    config = read_run(out).config
    assert config["tool_format"] == NATIVE and config["closed_loop"]["tool_format"] == NATIVE


def test_at_t0_a_drafting_methods_loop_equals_ars(native_run):
    out, _ = native_run
    tables = read_run(out)
    turns = tables.turns
    ar = turns[turns.method == "ar"].set_index("turn").sort_index()
    ngram = turns[turns.method == "ngram"].set_index("turn").sort_index()
    assert list(ar.index) == list(ngram.index)
    for turn in ar.index:
        assert list(ar.output_ids[turn]) == list(ngram.output_ids[turn])
        assert ar.context_len[turn] == ngram.context_len[turn]
    tools = read_tool_calls(out)
    assert tools[tools.method == "ngram"].matches_ar.all()
    scored = tools.dropna(subset=["solved"])  # one verdict per (method, loop): the last decode
    assert sorted(scored.method) == ["ar", "ngram"] and scored.solved.nunique() == 1
    assert scored.check.nunique() == 1


def test_a_template_without_tools_defaults_to_prompt(tmp_path, bfcl_dir):
    from evalsuite.run.runner import Runner

    target = build_tiny_target(tmp_path / "plain", "llama", max_positions=8192)
    runner = Runner(closed_config(target, bfcl_dir, tmp_path / "out", methods=["ar"], max_turns=1), tmp_path / "out",
                    PlantedEngine(closed_config(target, bfcl_dir, tmp_path / "out", methods=["ar"]), {}))
    runner.load()
    assert runner.config.tool_format == PROMPT
    assert read_run(tmp_path / "out").config["closed_loop"]["tool_format"] == PROMPT


# ---- BFCL's state-based check ---------------------------------------------------------------------------------
def _native_reply(logged: dict | None) -> str:
    return "\n".join(call(c["function"]["name"], **c["function"]["arguments"]) for c in (logged or {}).get(
        "tool_calls", []))


def _drive(trajectory, replies_per_turn: list[list[str]]):
    """A closed loop without a model: the planted replies of each user turn, then a closing reply."""
    policy = make_policy("stop", Window(1 << 20, 8, 3))
    replay = closed_replays(trajectory, ("ar",), policy, lambda t: (lambda messages: [0]), 0.0,
                            environment=lambda t: BfclEnvironment(t, NATIVE))["ar"]
    index = 0
    for replies in replies_per_turn:
        for text in replies + ["Done."]:
            assert replay.has_turn(index)
            replay.context(index)
            replay.record_reply(index, text)
            index += 1
    assert not replay.has_turn(index)
    return replay.turn_extra(index - 1)["tool_calls"][0]


@pytest.fixture(scope="module")
def entry():
    return {t.sample_id: t for t in get_task("bfcl-v3").load(LoadOptions())}["multi_turn_base_0"]


def _bfcl_verdict(entry, calls_per_turn: list[list[str]], name: str) -> dict:
    """bfcl-eval's own multi_turn_checker on call strings built from the bundled ground truth (data, not model
    output)."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    test_entry = {"id": entry.sample_id, "initial_config": entry.meta["initial_config"],
                  "involved_classes": entry.meta["involved_classes"]}
    return multi_turn_checker([[calls] if calls else [] for calls in calls_per_turn], entry.meta["ground_truth"],
                              test_entry, "multi_turn_base", name)


def test_the_state_check_marks_the_ground_truth_solved(entry):
    replies = [[_native_reply(turn.logged_reply)] for turn in entry.turns]
    row = _drive(entry, replies)
    assert row["solved"] is True and row["check"] == "solved"
    assert _bfcl_verdict(entry, entry.meta["ground_truth"], "evalsuite_test_right")["valid"]


def test_the_state_check_marks_a_wrong_final_state_unsolved(entry):
    replies = [[_native_reply(turn.logged_reply)] for turn in entry.turns]
    replies[0] = [call("cd", folder="document"), call("mkdir", dir_name="temp")]  # the file is never moved
    row = _drive(entry, replies)
    assert row["solved"] is False and row["check"].startswith("multi_turn:instance_state_mismatch (user turn 0)")
    truth = [list(t) for t in entry.meta["ground_truth"]]
    truth[0] = [c for c in truth[0] if not c.startswith("mv(")]
    bfcl = _bfcl_verdict(entry, truth, "evalsuite_test_wrong")
    assert not bfcl["valid"] and bfcl["error_type"] == "multi_turn:instance_state_mismatch"


def test_a_turn_without_calls_and_an_early_end_are_unsolved(entry):
    replies = [[_native_reply(turn.logged_reply)] for turn in entry.turns]
    replies[1] = []
    row = _drive(entry, replies)
    assert row["solved"] is False and "empty_turn_model_response (user turn 1)" in row["check"]
    policy = make_policy("stop", Window(1 << 20, 8, 3))
    replay = closed_replays(entry, ("ar",), policy, lambda t: (lambda m: [0]), 0.0, max_turns=1,
                            environment=lambda t: BfclEnvironment(t, NATIVE))["ar"]
    replay.context(0)
    replay.record_reply(0, _native_reply(entry.turns[0].logged_reply))
    row = replay.turn_extra(0)["tool_calls"][0]
    assert row["solved"] is False and "force_terminated" in row["check"] and "--max-turns" in row["check"]


def test_native_loop_never_evaluates_model_text(entry, tmp_path):
    marker = tmp_path / "pwned"
    environment = BfclEnvironment(entry, NATIVE)
    environment.begin_turn(0)
    outcome = environment.step(call(f"__import__('os').system('touch {marker}')")
                               + call("cd", folder=f"__import__('os').system('touch {marker}')"))
    assert not marker.exists()
    assert "not one of the provided functions" in outcome.messages[0]["content"]
    assert outcome.log.executed == [False, True]  # a string argument is only ever a string


# ---- the report -----------------------------------------------------------------------------------------------
def test_the_report_has_a_closed_loop_section_live_against_replayed(native_run, tools_target, bfcl_dir, tmp_path):
    from evalsuite.report.build import write_report
    from evalsuite.run.runner import Runner

    import shutil

    closed = tmp_path / "closed"  # planted outputs do not match their decode's steps: no span labels for them
    shutil.copytree(native_run[0], closed)
    shutil.rmtree(closed / "spans.parquet")
    logged = tmp_path / "logged"
    config = closed_config(tools_target, bfcl_dir, logged, replay="auto", max_turns=2)
    runner = Runner(config, logged, PlantedEngine(config, {}))
    runner.load()
    runner.run()
    report = write_report([closed, logged], tmp_path / "report", formats={"md", "csv"}, n_resamples=50)
    page = (tmp_path / "report" / "report.md").read_text()
    assert "## Closed agent loop: live tool calls" in page
    import pandas as pd

    summary = pd.read_csv(tmp_path / "report" / "tables" / "closed_loop.csv")
    ar = summary[summary.method == "ar"].iloc[0]
    assert ar.task == "bfcl-v3 closed" and ar.entries == 1 and ar.decodes == 6
    tools = read_tool_calls(closed)
    tools = tools[tools.method == "ar"]
    assert ar.calls == sum(len(c) for c in tools.calls) and ar.executed == sum(sum(e) for e in tools.executed)
    assert ar.refused == 2 and ar.parse_errors == 1 and ar.scored == 1
    steps = pd.read_csv(tmp_path / "report" / "tables" / "closed_loop_steps.csv")
    assert set(steps.step.astype(str)) <= {"0", "1", "2", "3+"} and (steps[steps.step.astype(str) != "0"].growth_mean > 0).all()
    live = pd.read_csv(tmp_path / "report" / "tables" / "closed_loop_live_vs_replayed.csv")
    whole = live[(live.method == "ngram") & (live.context_bin == "all")].iloc[0]
    assert whole.live_decodes == 6 and whole.replayed_decodes == 2
    assert (summary.skipped_user_turns == 0).all()
    paired = pd.read_csv(tmp_path / "report" / "tables" / "closed_loop_live_minus_replayed.csv")
    ngram = paired[paired.method == "ngram"].iloc[0]
    assert ngram.entries == 1 and abs(ngram.tau_difference - (ngram.live_tau - ngram.replayed_tau)) < 1e-12
    assert np.isnan(ngram.tau_low) and "undecided (n = 1)" in page  # one entry: no interval, no claim
    assert report.out == tmp_path / "report"


def _turn_rows(source: str, taus: dict, seconds: float) -> pd.DataFrame:
    """Decoded turns of one drafting method: per entry two turns of 10 verify steps at the given τ."""
    rows = [{"method": "dlite", "source": source, "sample_id": entry, "turn": turn, "tau": tau, "steps": 10,
             "context_len": 7000, "stop_reason": "eos", "ar_decode_s": 1.0, "ar_new_tokens": 20,
             "decode_s": seconds, "new_tokens": 20} for entry, tau in taus.items() for turn in (0, 1)]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("live_taus,reading", [
    ({f"e{i}": 1.3 + 0.05 * i for i in range(6)}, "lower live"),
    ({f"e{i}": 1.6 + 0.05 * i for i in range(6)}, "no difference shown"),
    ({f"e{i}": 1.9 + 0.05 * i for i in range(6)}, "higher live")])
def test_live_against_replayed_is_paired_by_entry_and_claims_only_what_its_interval_shows(monkeypatch, live_taus,
                                                                                        reading):
    """The entries differ a lot from one another (τ 1.6 … 1.85 replayed) but each live loop sits a fixed 0.3
    below, level with, or above its own replay: paired by entry, the interval is narrow and its side decides."""
    from types import SimpleNamespace

    from evalsuite.report import closed_loop

    replayed = {f"e{i}": 1.6 + 0.05 * i for i in range(6)}
    frame = pd.concat([_turn_rows("live", live_taus, 0.8), _turn_rows("replayed", replayed, 0.5)], ignore_index=True)
    monkeypatch.setattr(closed_loop, "_live_and_replayed", lambda results, run, rows: frame)
    rows = pd.DataFrame({"task": ["bfcl-v3 closed"]})
    table = closed_loop.live_minus_replayed(None, SimpleNamespace(key="r"), rows, seed=0, n_resamples=500)
    row = table.iloc[0]
    assert row.entries == 6
    shift = np.mean(list(live_taus.values())) - np.mean(list(replayed.values()))
    assert row.tau_difference == pytest.approx(shift) and row.tau_low <= shift <= row.tau_high
    assert closed_loop._reading(row) == reading
    assert row.speedup_ratio == pytest.approx(0.5 / 0.8)  # (ar/live) ÷ (ar/replayed) with equal tokens
