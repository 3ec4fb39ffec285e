"""BFCL-v3's environment for the closed loop (`--replay closed`, docs/closed_loop.md): the target's own calls run
against bfcl-eval's simulated backends, and their results are its next messages.

Two ways of asking for calls (`tool_format`, run.json `tool_format`):
- `native` (the default where the target's chat template takes `tools`): BFCL's function-calling (FC) mode. The
  function docs go to the template as its tools (BFCL's FC conversion, data.py `bfcl_tool`), no system prompt of
  ours. Replies are parsed as the template's `<tool_call>` JSON blocks (`native_calls.parse_native`; the same JSON
  call objects in a ``` fence or bare are taken too, recorded per call in `forms`), and each call is checked against
  its tool's schema first (`native_calls.ToolIndex.check`: an unknown function, an unexpected or missing argument, a
  wrong type: an error observation, not executed). The reply enters the history as the template's assistant message
  with `tool_calls`, each result (or error) as a `tool` message.
- `prompt`: BFCL's prompting mode: BFCL's default system prompt (the function docs as JSON) before the first turn,
  no native tools; replies parsed as BFCL call lists (`calls.parse_calls`), results and the parse-error observation
  as `tool` messages named after the call.

A user turn ends at a reply that calls nothing, or after `step_limit` decodes in it (BFCL's own limit, 20); then
BFCL's state-based multi-turn check (check.py `StateCheck`, bfcl-eval's own `state_checker`/`response_checker`, the
calls never eval'd) compares the backends with the ground truth's. `log` keeps, per user turn and decode step, the
executed calls, their results' size in bytes, and errors.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from dataclasses import dataclass, field

from evalsuite.errors import UserError
from evalsuite.tasks.base import Trajectory, Turn
from evalsuite.tasks.bfcl_v3.backends import INSTALL_HINT, Backends, require_bfcl
from evalsuite.tasks.bfcl_v3.calls import Call, parse_calls
from evalsuite.tasks.bfcl_v3.check import StateCheck
from evalsuite.tasks.bfcl_v3.native_calls import FORMAT_HINT, ToolIndex, call_text, parse_native
from evalsuite.tasks.environment import Environment, StepLog, StepOutcome, Verdict, register_environment

STEP_LIMIT = 20  # bfcl_eval.constants.default_prompts.MAXIMUM_STEP_LIMIT
NATIVE, PROMPT = "native", "prompt"  # --tool-format: the template's own tools and calls | BFCL's prompting mode
PROMPTS = {
    PROMPT: "BFCL prompting mode: python call syntax, the function docs as JSON in the system prompt",
    NATIVE: ("the template's native tools (BFCL's FC mode): the function docs as JSON-schema tools rendered by the chat "
             "template, calls as <tool_call> JSON (also accepted: the same JSON call objects in a ``` fence or bare, "
             "tool_calls.forms) checked against their schema, results as tool messages"),
}


@dataclass
class TurnLog:
    turn: int  # the user turn
    steps: list[StepLog] = field(default_factory=list)
    stop: str = ""  # no_calls | step_limit | skipped

    @property
    def calls(self) -> int:
        return sum(len(s.calls) for s in self.steps)

    @property
    def executed(self) -> int:
        return sum(sum(s.executed) for s in self.steps)

    @property
    def result_bytes(self) -> int:
        return sum(sum(s.result_bytes) for s in self.steps)

    @property
    def errors(self) -> int:
        return sum(sum(1 for e in s.errors if e) + bool(s.parse_error) for s in self.steps)

    @property
    def results(self) -> list[str]:
        return [r for s in self.steps for r in s.results]


def backend_names(trajectory: Trajectory) -> dict[str, str]:
    """The name the model sees for each function (BFCL's FC conversion turns "." into "_") → its backend name."""
    return {d["name"].replace(".", "_"): d["name"] for d in trajectory.meta.get("function_docs") or []}


def system_prompt(function_docs: list[dict]) -> str:
    """BFCL's default prompting-mode system prompt (ret_fmt=python, no tag, json docs, plaintext, classic), built
    from bfcl-eval's own templates, over the docs with BFCL's Python-syntax hint appended to each description."""
    require_bfcl()
    from bfcl_eval.constants import default_prompts as prompts

    docs = copy.deepcopy(function_docs)
    for doc in docs:
        doc["description"] = doc.get("description", "") + " Note that the provided function is in Python 3 syntax."
    style = prompts.PROMPT_STYLE_TEMPLATES["classic"]
    return prompts.PROMPT_TEMPLATE_MAPPING["plaintext"].format(
        persona=style["persona"], task=style["task"],
        tool_call_format=style["tool_call_no_tag"].format(output_format=prompts.OUTPUT_FORMAT_MAPPING["python"],
                                                          param_types=prompts.PARAM_TYPE_MAPPING["python"]),
        multiturn_behavior=style["multiturn_behavior"],
        available_tools=style["available_tools"].format(format="json", functions=json.dumps(docs, indent=4)))


def closed_trajectory(trajectory: Trajectory, tool_format: str = PROMPT) -> Trajectory:
    """The trajectory as the closed loop runs it: the user turns, no logged replies; prompt: BFCL's prompting-mode
    system prompt first and no native tools; native: the function docs as the template's tools (BFCL's FC
    conversion, data.py `bfcl_tool`) and no system message of ours (BFCL's FC handlers add none: the template's own
    default system prompt and tool block frame the tools)."""
    docs = trajectory.meta.get("function_docs")
    if docs is None:
        raise UserError(f"--replay closed: sample {trajectory.sample_id} has no BFCL function docs "
                        "(the closed loop runs --task bfcl-v3)")
    turns = [Turn(new_messages=[dict(m) for m in turn.new_messages]) for turn in trajectory.turns]
    if tool_format == NATIVE:
        if not trajectory.tools:
            raise UserError(f"--tool-format native: sample {trajectory.sample_id} has no tools")
        return Trajectory(trajectory.sample_id, turns, tools=copy.deepcopy(trajectory.tools),
                          meta=dict(trajectory.meta))
    turns[0].new_messages.insert(0, {"role": "system", "content": system_prompt(docs)})
    return Trajectory(trajectory.sample_id, turns, tools=None, meta=dict(trajectory.meta))


@register_environment("bfcl-v3")
class BfclEnvironment(Environment):
    """One bfcl-v3 trajectory's backends, loaded fresh from its initial state, and BFCL's check of them."""

    def __init__(self, trajectory: Trajectory, tool_format: str = PROMPT, step_limit: int = STEP_LIMIT):
        super().__init__(trajectory, tool_format)
        if step_limit < 1:
            raise UserError(f"closed loop: the step limit must be >= 1, got {step_limit}")
        if tool_format not in (NATIVE, PROMPT):
            raise UserError(f"closed loop: tool format {tool_format!r}: choose {NATIVE} or {PROMPT}")
        meta = trajectory.meta
        if "initial_config" not in meta or "involved_classes" not in meta:
            raise UserError(f"--replay closed: sample {trajectory.sample_id} has no BFCL initial state "
                            "(the closed loop runs --task bfcl-v3)")
        self.step_limit = step_limit
        self._trajectory = closed_trajectory(trajectory, tool_format)
        self.backends = Backends(list(meta["involved_classes"]), meta["initial_config"], bool(meta.get("long_context")))
        self.tools = ToolIndex(trajectory.tools or [], backend_names(trajectory))
        truth = meta.get("ground_truth")
        self.check = StateCheck(meta, truth) if truth is not None else None
        self.log: list[TurnLog] = []
        self.turn_over = True

    @property
    def trajectory(self) -> Trajectory:
        return self._trajectory

    @property
    def current(self) -> TurnLog:
        return self.log[-1]

    def begin_turn(self, user_turn: int) -> None:
        self.log.append(TurnLog(user_turn))
        self.turn_over = False

    def step(self, reply: str) -> StepOutcome:
        """Execute the reply's calls. The user turn is over when the reply called no function (`no_calls`) or at the
        step limit (`step_limit`, the results still come back); then BFCL checks the backends' state."""
        if self.turn_over:
            raise RuntimeError("a reply outside a user turn: call begin_turn first")
        turn = self.current
        log = StepLog(len(turn.steps))
        turn.steps.append(log)
        if self.tool_format == NATIVE:
            assistant, messages = self._native(reply, log)
        else:
            assistant, messages = {"role": "assistant", "content": reply}, self._prompt(reply, log)
        if messages is None:
            self._end_turn("no_calls")
        elif len(turn.steps) >= self.step_limit:
            self._end_turn("step_limit")
        return StepOutcome(assistant, messages or [], log, turn.stop if self.turn_over else "")

    def interrupt(self, stop: str) -> None:
        if not self.turn_over:
            self.current.stop = stop
            self.turn_over = True

    def finish(self, reason: str = "") -> Verdict | None:
        return None if self.check is None else self.check.finish(reason)

    def _end_turn(self, stop: str) -> None:
        """The model ended the user turn: BFCL's check of the backends' state after it (the step limit fails the
        entry, as BFCL's force-quit does)."""
        turn = self.current
        turn.stop, self.turn_over = stop, True
        if self.check is None:
            return
        self.check.end_turn(turn.turn, self.backends, turn.calls, turn.results)
        if stop == "step_limit" and self.check.verdict is None:
            self.check.verdict = Verdict(False, "multi_turn:force_terminated",
                                         f"the step limit ({self.step_limit} decodes) ended the turn", turn.turn)

    def _run(self, log: StepLog, call: Call, shown: str, form: str = "python") -> str:
        result, error = self.backends.execute(call)
        log.forms.append(form)
        log.calls.append(shown)
        log.result_bytes.append(len(result.encode("utf-8")))
        log.errors.append(error)
        log.executed.append(True)
        log.results.append(result)
        return result

    def _prompt(self, text: str, log: StepLog) -> list[dict] | None:
        """BFCL call lists: the tool messages, or None when the reply calls nothing."""
        parsed = parse_calls(text)
        if not parsed.attempted or (not parsed.calls and not parsed.error):
            return None
        messages = []
        if parsed.error:
            log.parse_error = parsed.error
            messages.append({"role": "tool", "name": "error",
                             "content": f"Error: the function calls could not be parsed: {parsed.error}. Write "
                                        f"them as [func_name(param=value, ...), ...]."})
        for call in parsed.calls:
            messages.append({"role": "tool", "name": call.text(), "content": self._run(log, call, call.text())})
        return messages

    def _native(self, text: str, log: StepLog) -> tuple[dict, list[dict] | None]:
        """The template's `<tool_call>` blocks: (the reply's history message, the tool messages or None when the
        reply calls nothing)."""
        assistant = {"role": "assistant", "content": text}
        reply = parse_native(text)
        if not reply.attempted:
            return assistant, None
        if reply.errors:
            log.parse_error = "; ".join(reply.errors)
        else:  # every block is a call: the template's own assistant message
            assistant = {"role": "assistant", "content": reply.content, "tool_calls": [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in reply.calls]}
        messages = []
        for block in reply.blocks:
            if block.call is None:
                messages.append({"role": "tool", "name": "error", "content": f"Error: {block.error}. {FORMAT_HINT}"})
                continue
            name, arguments = block.call.name, block.call.arguments
            backend, refused = self.tools.check(name, arguments)
            shown = call_text(name, arguments)
            if refused:
                observation = f"Error: {refused}"
                log.forms.append(block.call.form)
                log.calls.append(shown)
                log.result_bytes.append(len(observation.encode("utf-8")))
                log.errors.append(refused)
                log.executed.append(False)
            else:
                observation = self._run(log, Call(backend, [], dict(arguments)), shown, block.call.form)
            messages.append({"role": "tool", "name": name, "content": observation})
        if reply.unclosed:
            messages.append({"role": "tool", "name": "error",
                             "content": f"Error: a <tool_call> is never closed with </tool_call>. {FORMAT_HINT}"})
        return assistant, messages

    @classmethod
    def require(cls) -> None:
        if importlib.util.find_spec("bfcl_eval") is None:
            raise UserError(f"--replay closed needs bfcl-eval's simulated tool backends: {INSTALL_HINT}")

    @classmethod
    def describe(cls, tool_format: str, rendering: str = "") -> dict:
        try:
            from importlib.metadata import version

            backend = f"bfcl-eval {version('bfcl-eval')}"
        except Exception:  # noqa: BLE001 - metadata of a --no-deps install may be missing
            backend = "bfcl-eval"
        return {
            "step_limit": STEP_LIMIT,
            "tool_format": tool_format,
            "prompt": PROMPTS[tool_format] + (f" ({rendering})" if rendering else ""),
            "check": ("BFCL's state-based multi-turn check against possible_answer (bfcl-eval's state_checker and "
                      "response_checker after each user turn; the calls executed by the loop, never eval'd): "
                      "tool_calls.solved on each loop's last decode"),
            "backends": backend,
        }
