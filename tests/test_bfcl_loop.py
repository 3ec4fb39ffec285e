"""The closed BFCL loop's parts: calls parsed from planted replies run against bfcl-eval's real simulated backends
(loaded from the task's initial state), their results come back as the next messages and reach the next context;
malformed calls and execution errors are observations; nothing but the backends' methods is ever called."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from evalsuite.config import RunConfig
from evalsuite.errors import UserError
from evalsuite.tasks import LoadOptions, get_task

pytest.importorskip("bfcl_eval.eval_checker.multi_turn_eval.func_source_code.gorilla_file_system")
from evalsuite.tasks.bfcl_v3.backends import Backends, require_bfcl  # noqa: E402
from evalsuite.tasks.bfcl_v3.calls import Call, parse_calls  # noqa: E402
from evalsuite.tasks.bfcl_v3.environment import BfclEnvironment, closed_trajectory  # noqa: E402


@pytest.fixture(scope="module")
def bfcl():
    return {t.sample_id: t for t in get_task("bfcl-v3").load(LoadOptions())}


# ---- parsing --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reply,expected", [
    ("[cd(folder='document'), mkdir(dir_name='temp')]", [("cd", [], {"folder": "document"}),
                                                          ("mkdir", [], {"dir_name": "temp"})]),
    ("  ls(a=True)  ", [("ls", [], {"a": True})]),  # bare: BFCL's decoder adds the brackets
    ("```python\n[sort('final_report.pdf')]\n```", [("sort", ["final_report.pdf"], {})]),
    ("<TOOLCALL>[mean(numbers=[1, 2.5, -3])]</TOOLCALL>", [("mean", [], {"numbers": [1, 2.5, -3]})]),
    ('<tool_call>{"name": "cd", "arguments": {"folder": "temp"}}</tool_call>', [("cd", [], {"folder": "temp"})]),
    ("[GorillaFileSystem.pwd()]", [("GorillaFileSystem.pwd", [], {})]),
])
def test_calls_are_parsed_from_bfcl_syntax(reply, expected):
    parsed = parse_calls(reply)
    assert parsed.attempted and not parsed.error
    assert [(c.name, c.args, c.kwargs) for c in parsed.calls] == expected


@pytest.mark.parametrize("reply", ["I moved the file for you.", "[]", "", "Sure! [cd(folder='x')]"])
def test_replies_without_calls_end_the_turn(reply):
    parsed = parse_calls(reply)
    assert parsed.calls == [] and not parsed.error


@pytest.mark.parametrize("reply,reason", [
    ("[cd(folder='a'", "not valid call syntax"),
    ("[cd(folder=somewhere)]", "argument folder of cd is not a literal"),
    ("[power(base=2, exponent=2**10)]", "argument exponent of power is not a literal"),
    ("[cd(**{'folder': 'a'})]", "**kwargs are not accepted"),
    ("[cd(folder='a'), 42]", "is not a function call"),
    ("[__import__('os').system('touch /tmp/x')]", "is not a plain function name"),
    ('<tool_call>{"name": "cd", "arguments": {"folder": </tool_call>', "not JSON"),
])
def test_malformed_calls_are_parse_errors_and_never_evaluated(reply, reason):
    parsed = parse_calls(reply)
    assert parsed.attempted and parsed.calls == [] and reason in parsed.error


# ---- the backends ---------------------------------------------------------------------------------------------
def test_backends_load_the_initial_state_as_bfcls_checker(bfcl):
    trajectory = bfcl["multi_turn_base_0"]
    backends = Backends(trajectory.meta["involved_classes"], trajectory.meta["initial_config"])
    assert set(backends.instances) == {"TwitterAPI", "GorillaFileSystem"}
    result, error = backends.execute(Call("ls", [], {}))
    assert not error and json.loads(result) == {"current_directory_content": ["document", "archive"]}
    result, _ = backends.execute(Call("get_user_tweets", [], {"username": "analyst_pro"}))
    assert "Budget analysis insights coming soon!" in result  # TwitterAPI loaded from initial_config
    # a second set of backends starts from the same initial state (BFCL's global instances are not reused)
    backends.execute(Call("mkdir", [], {"dir_name": "new"}))
    fresh = Backends(trajectory.meta["involved_classes"], trajectory.meta["initial_config"])
    assert "new" not in fresh.execute(Call("ls", [], {}))[0]


def test_execution_errors_are_observations(bfcl):
    trajectory = bfcl["multi_turn_base_0"]
    backends = Backends(trajectory.meta["involved_classes"], trajectory.meta["initial_config"])
    assert backends.execute(Call("rm_rf", [], {})) == ("Error during execution: name 'rm_rf' is not defined",
                                                       "name 'rm_rf' is not defined")
    result, error = backends.execute(Call("cd", [], {"no_such_arg": 1}))
    assert result.startswith("Error during execution:") and "no_such_arg" in error
    assert backends.execute(Call("_load_scenario", [{}], {}))[1] == "name '_load_scenario' is not defined"
    assert backends.execute(Call("os.system", ["ls"], {}))[1] == "name 'os.system' is not defined"
    math = Backends(["MathAPI"], {})
    assert math.execute(Call("power", [], {"base": 10, "exponent": 10 ** 9}))[1] == "the exponent is too large"
    assert json.loads(math.execute(Call("power", [], {"base": 2, "exponent": 10}))[0]) == {"result": 1024}


# ---- the loop -------------------------------------------------------------------------------------------------
def test_planted_replies_run_against_the_real_backend_and_their_results_come_back(bfcl):
    environment = BfclEnvironment(bfcl["multi_turn_base_0"])
    environment.begin_turn(0)
    first = environment.step("[cd(folder='document'), mkdir(dir_name='temp'), "
                             "mv(source='final_report.pdf', destination='temp')]").messages
    assert [m["role"] for m in first] == ["tool"] * 3
    assert [m["name"] for m in first] == ["cd(folder='document')", "mkdir(dir_name='temp')",
                                          "mv(source='final_report.pdf', destination='temp')"]
    assert json.loads(first[2]["content"]) == {"result": "'final_report.pdf' moved to 'temp/final_report.pdf'"}
    second = environment.step("[cd(folder='temp'), ls()]").messages  # the state changed: the file is in temp now
    assert json.loads(second[1]["content"]) == {"current_directory_content": ["final_report.pdf"]}
    last = environment.step("The report is in temp now.")
    assert last.messages == [] and last.stop == "no_calls" and environment.turn_over
    log = environment.current
    assert (log.turn, log.stop, len(log.steps), log.calls, log.errors) == (0, "no_calls", 3, 5, 0)
    assert log.steps[0].result_bytes == [len(m["content"].encode()) for m in first]
    assert log.result_bytes == sum(len(m["content"].encode()) for m in first + second) > 0
    assert log.steps[1].calls == ["cd(folder='temp')", "ls()"]


def test_a_malformed_call_is_an_error_observation_and_the_loop_goes_on(bfcl):
    environment = BfclEnvironment(bfcl["multi_turn_base_0"])
    environment.begin_turn(0)
    outcome = environment.step("[cd(folder=document)]")
    observation = outcome.messages
    assert len(observation) == 1 and observation[0]["role"] == "tool"
    assert "could not be parsed" in observation[0]["content"] and "not a literal" in observation[0]["content"]
    assert outcome.stop == "" and not environment.turn_over
    failing = environment.step("[cat(file_name='nope.txt'), cd()]").messages
    assert json.loads(failing[0]["content"]) == {"error": "cat: 'nope.txt': No such file or directory"}
    assert failing[1]["content"].startswith("Error during execution:") and "folder" in failing[1]["content"]
    assert environment.step("done").stop == "no_calls"
    steps = environment.current.steps
    assert steps[0].parse_error and steps[0].calls == []
    assert steps[1].errors[0] == "cat: 'nope.txt': No such file or directory" and "folder" in steps[1].errors[1]
    assert environment.current.errors == 3 and environment.current.stop == "no_calls"


def test_the_step_limit_ends_the_user_turn_with_the_last_results(bfcl):
    environment = BfclEnvironment(bfcl["multi_turn_base_1"], step_limit=2)
    environment.begin_turn(0)
    assert environment.step("[pwd()]").messages and not environment.turn_over
    last = environment.step("[cd(folder='workspace'), ls(a=True)]")
    assert ".hidden_file" in last.messages[1]["content"] and environment.turn_over
    assert last.stop == environment.current.stop == "step_limit"
    with pytest.raises(RuntimeError):
        environment.step("[pwd()]")


def test_closed_trajectory_uses_bfcls_prompt_and_drops_logged_replies(bfcl):
    trajectory = bfcl["multi_turn_base_0"]
    closed = closed_trajectory(trajectory)
    assert closed.tools is None and all(turn.logged_reply is None for turn in closed.turns)
    system = closed.turns[0].new_messages[0]
    assert system["role"] == "system" and system["content"].startswith("You are an expert in composing functions.")
    docs = json.loads(system["content"].split("that you can invoke.\n", 1)[1].strip())
    assert [d["name"] for d in docs] == [d["name"] for d in trajectory.meta["function_docs"]]
    assert docs[0]["description"].endswith(" Note that the provided function is in Python 3 syntax.")
    assert closed.turns[0].new_messages[1:] == trajectory.turns[0].new_messages


def test_without_bfcl_eval_closed_replay_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "bfcl_eval.eval_checker.multi_turn_eval.func_source_code", None)
    with pytest.raises(UserError) as err:
        require_bfcl()
    assert "\n" not in str(err.value) and "evalsuite[bfcl]" in str(err.value) and "--no-deps" in str(err.value)
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)  # what RunConfig.validate looks for (without importing it)
    with pytest.raises(UserError, match=r"--replay closed needs bfcl-eval.*evalsuite\[bfcl\]") as err:
        RunConfig(methods=["ar"], task="bfcl-v3", replay="closed").validate()
    assert "\n" not in str(err.value)


def test_closed_replay_is_refused_off_bfcl():
    with pytest.raises(UserError, match="use --task bfcl-v3"):
        RunConfig(methods=["ar"], task="gsm8k", replay="closed").validate()
    RunConfig(methods=["ar", "ngram"], task="bfcl-v3", replay="closed").validate()


def test_no_model_code_is_executed(bfcl, tmp_path):
    marker = tmp_path / "pwned"
    environment = BfclEnvironment(bfcl["multi_turn_base_0"])
    environment.begin_turn(0)
    for reply in (f"[__import__('os').system('touch {marker}')]", f"[open('{marker}', 'w')]",
                  f"[exec(\"open('{marker}', 'w')\")]", f"[eval(\"open('{marker}', 'w')\")]"):
        environment.step(reply)
    assert not Path(marker).exists()
    assert environment.current.errors == 4
