"""Agent-trajectory formats (`--task swebench --data-path … [--format …]`): every fixture of one conversation, in
each format, turns into the same turns; detection, --format, the Parquet layout of the hub sets, bad shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evalsuite.errors import UserError
from evalsuite.tasks import LoadOptions, get_task
from evalsuite.tasks import _source
from evalsuite.tasks._trajectory_formats import FORMAT_NAMES, detect_format

FIXTURES = Path(__file__).parent / "fixtures" / "swebench_formats"
TOOL_FILES = {"openhands": "openhands_trajectory.json", "swe-gym-openhands": "swe_gym_openhands.jsonl",
              "swe-rebench-openhands": "swe_rebench_openhands.jsonl"}
TEXT_FILES = {"mini-swe-agent": "acme__util-1.traj.json", "nebius-swe-agent": "nebius_swe_agent.jsonl"}


def load(path, **options):
    return get_task("swebench").load(LoadOptions(data_path=str(path), **options))


def call(call_id: str, name: str, arguments: dict) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}, "id": call_id}


def tool_conversation_turns() -> list[tuple[list[dict], dict]]:
    """The tool-calling conversation every tool fixture holds, as (new messages, logged reply) per turn."""
    path = "/workspace/acme__util__1.0/util.py"
    system = {"role": "system", "content": "You are OpenHands agent, a helpful AI assistant that can interact with a "
                                          "computer to solve tasks."}
    task = {"role": "user", "content": (
        "<uploaded_files>\n/workspace/acme__util__1.0\n</uploaded_files>\nI've uploaded a python code repository. "
        "Consider the following PR description:\n<pr_description>\nlast() raises IndexError\n</pr_description>")}
    first = {"role": "assistant", "content": "Let me look at the file first.",
             "tool_calls": [call("call_1", "execute_bash", {"command": "cat util.py"})]}
    second = {"role": "assistant", "content": "", "tool_calls": [
        call("call_2", "str_replace_editor", {"command": "str_replace", "path": path, "old_str": "xs[len(xs)]",
                                              "new_str": "xs[len(xs) - 1]"}),
        call("call_3", "execute_bash", {"command": "python -c 'import util; print(util.last([1, 2]))'"})]}
    final = {"role": "assistant", "content": "Fixed: last() now returns the last element instead of indexing past "
                                            "the end."}
    return [([system, task], first),
            ([{"role": "tool", "content": "def last(xs):\n    return xs[len(xs)]\n", "tool_call_id": "call_1",
               "name": "execute_bash"}], second),
            ([{"role": "tool", "content": f"The file {path} has been edited.", "tool_call_id": "call_2",
               "name": "str_replace_editor"},
              {"role": "tool", "content": "2", "tool_call_id": "call_3", "name": "execute_bash"}], final)]


def text_conversation_turns() -> list[tuple[list[dict], dict]]:
    system = {"role": "system", "content": "You are a helpful assistant that can interact with a computer shell to "
                                          "solve programming tasks."}
    task = {"role": "user", "content": "<pr_description>\nlast() raises IndexError in util.py\n</pr_description>"}
    return [([system, task], {"role": "assistant", "content": "THOUGHT: look at the file first.\n\n```bash\n"
                                                             "cat util.py\n```"}),
            ([{"role": "user", "content": "<returncode>0</returncode>\n<output>\ndef last(xs):\n    return "
                                          "xs[len(xs)]\n</output>"}],
             {"role": "assistant", "content": "THOUGHT: fix the index.\n\n```bash\nsed -i 's/xs\\[len(xs)\\]/xs[-1]/' "
                                              "util.py\n```"})]  # the trailing observation is not replayed


def turns_of(trajectory) -> list[tuple[list[dict], dict]]:
    return [(turn.new_messages, turn.logged_reply) for turn in trajectory.turns]


@pytest.mark.parametrize("fmt", sorted(TOOL_FILES))
def test_each_tool_calling_format_gives_the_same_turns_and_tools(fmt):
    detected, = load(FIXTURES / TOOL_FILES[fmt])
    named, = load(FIXTURES / TOOL_FILES[fmt], format=fmt)
    assert turns_of(detected) == turns_of(named) == tool_conversation_turns()
    assert detected.meta["format"] == fmt and detected.sample_id.startswith("swebench-")
    assert [t["function"]["name"] for t in detected.tools] == ["execute_bash", "str_replace_editor"]
    assert detected.tools[1]["function"]["parameters"]["properties"]["command"]["enum"] == ["view", "str_replace"]


@pytest.mark.parametrize("fmt", sorted(TEXT_FILES))
def test_each_text_agent_format_gives_the_same_turns(fmt):
    trajectories = load(FIXTURES / TEXT_FILES[fmt])
    assert all(turns_of(t) == text_conversation_turns() for t in trajectories)
    assert {t.meta["format"] for t in trajectories} == {fmt}


def test_the_formats_carry_instance_repo_and_resolved_flag():
    gym, = load(FIXTURES / TOOL_FILES["swe-gym-openhands"])
    rebench, = load(FIXTURES / TOOL_FILES["swe-rebench-openhands"])
    events, = load(FIXTURES / TOOL_FILES["openhands"])
    output, = load(FIXTURES / "openhands_output.jsonl")
    nebius = load(FIXTURES / TEXT_FILES["nebius-swe-agent"])
    assert gym.sample_id == rebench.sample_id == output.sample_id == "swebench-acme__util-1"
    assert events.sample_id == "swebench-openhands_trajectory"  # a bare event list has no instance id: the file name
    assert (gym.meta["repo"], gym.meta["resolved"], gym.meta["run_id"]) == (
        "acme/util", True, "gpt-4o-2024-08-06_maxiter_30_N_v2.1-no-hint-train-t04-run_1")
    assert (rebench.meta["repo"], rebench.meta["resolved"], rebench.meta["trajectory_id"]) == (
        "acme/util", False, "chatcmpl-0001")  # resolved is an int (0) on the hub
    assert (output.meta["resolved"], events.meta["resolved"]) == (True, None)
    assert turns_of(output) == tool_conversation_turns()
    # two nebius rows of one instance: distinct sample ids, each with its own model and flag
    assert [t.sample_id for t in nebius] == ["swebench-acme__util-1", "swebench-acme__util-1#2"]
    assert [(t.meta["model"], t.meta["resolved"]) for t in nebius] == [("swe-agent-llama-70b", False),
                                                                       ("swe-agent-qwen-72b", True)]


def test_a_hub_set_as_parquet_with_null_filled_structs(tmp_path):
    """The hub sets are Parquet: a list of structs holds the union of every message's keys, missing ones null."""
    for fmt in ("swe-rebench-openhands", "swe-gym-openhands"):
        rows = [json.loads(line) for line in (FIXTURES / TOOL_FILES[fmt]).read_text().splitlines()]
        path = tmp_path / f"{fmt}.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
        stored = pq.read_table(path).to_pylist()[0]
        tools_key = "tools"
        assert None in stored[tools_key][0]["function"]["parameters"]["properties"]["command"].values()
        trajectory, = load(path)
        assert trajectory.meta["format"] == fmt
        assert turns_of(trajectory) == tool_conversation_turns()
        assert "enum" not in trajectory.tools[0]["function"]["parameters"]["properties"]["command"]


def test_a_directory_of_row_files_and_the_bundled_sets_still_load(tmp_path):
    for name in ("nebius_swe_agent.jsonl", "swe_gym_openhands.jsonl"):
        (tmp_path / name).write_text((FIXTURES / name).read_text())
    found = load(tmp_path)
    assert sorted(t.meta["format"] for t in found) == ["nebius-swe-agent", "nebius-swe-agent", "swe-gym-openhands"]
    assert len({t.sample_id for t in found}) == 3


def test_an_unknown_shape_is_one_line_naming_the_formats(tmp_path):
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"steps": [1, 2], "id": "x"}) + "\n")
    with pytest.raises(UserError) as err:
        load(odd)
    message = str(err.value)
    assert "\n" not in message and f"{odd}:1" in message and "not a known trajectory format" in message
    assert all(name in message for name in FORMAT_NAMES) and "--format" in message
    with pytest.raises(UserError, match="--format nope: choose from auto, openhands"):
        load(odd, format="nope")


def test_a_named_format_that_does_not_fit_is_one_line():
    with pytest.raises(UserError) as err:
        load(FIXTURES / TOOL_FILES["swe-gym-openhands"], format="nebius-swe-agent")
    assert "\n" not in str(err.value) and "not in the nebius-swe-agent format" in str(err.value)


def test_format_is_refused_where_it_does_not_apply():
    with pytest.raises(UserError, match="--format openhands: task gsm8k reads one format"):
        get_task("gsm8k").load(LoadOptions(format="openhands"))
    with pytest.raises(UserError, match="--subset lite reads instance or prompt rows"):
        get_task("swebench").load(LoadOptions(subset="lite", format="openhands"))


def test_detection_by_shape():
    assert detect_format([{"action": "message", "source": "user"}], "x").name == "openhands"
    assert detect_format({"history": [{"role": "user", "content": "u"}]}, "x").name == "swe-agent"
    assert detect_format({"messages": [{"role": "user"}], "info": {}}, "x").name == "mini-swe-agent"
    assert detect_format({"messages": [{"role": "user"}], "run_id": "r"}, "x").name == "swe-gym-openhands"
    assert detect_format({"trajectory": [{"role": "ai", "text": "t"}]}, "x").name == "nebius-swe-agent"
    assert detect_format({"trajectory": [{"role": "assistant", "content": "c"}]}, "x").name == "swe-rebench-openhands"
    assert detect_format({"problem_statement": "p"}, "x").name == "swebench-instances"
    assert detect_format({"text": "t"}, "x").name == "swebench-prompts"


def test_a_hub_trajectory_set_offline_is_one_line(monkeypatch):
    monkeypatch.setattr(_source, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(UserError) as err:
        load("nebius/SWE-rebench-openhands-trajectories")
    assert "\n" not in str(err.value) and "nebius/SWE-rebench-openhands-trajectories" in str(err.value)
    assert "not reachable" in str(err.value)
