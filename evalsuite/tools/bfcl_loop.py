"""A closed agent loop on BFCL-v3 multi-turn: the target's own tool calls are executed against `bfcl-eval`'s
simulated backends and their results become its next context (`--replay closed`).

Two ways of asking for calls (`--tool-format`, run.json `tool_format`; docs/closed_loop.md):
- `native` (the default where the target's chat template takes `tools`): BFCL's function-calling (FC) mode. The
  function docs go to the template as its tools (BFCL's FC conversion, tasks/bfcl_v3.py `bfcl_tool`: JSON-schema
  parameters, BFCL's types mapped to JSON-schema types), no system prompt of ours. Replies are parsed as the
  template's `<tool_call>{"name": …, "arguments": {…}}</tool_call>` blocks with `json.loads` only
  (`native_calls.parse_native`; the same JSON call objects in a ``` fence or bare are taken too, recorded per call
  in `forms`), and each call is checked against its tool's schema (`native_calls.ToolIndex.check`: unknown
  function, unexpected or missing argument, wrong type → an error observation, not executed). The reply enters the
  history as the template's assistant message with `tool_calls`, each result (or error) as a `tool` message.
- `prompt`: BFCL's prompting mode, as below (the default for templates without tools).

After each user turn BFCL's state-based multi-turn check (`bfcl_check.StateCheck`, bfcl-eval's own
`state_checker`/`response_checker`, the calls never eval'd) compares the loop's backends with the ground truth's;
the entry's verdict is `tool_calls.solved` on the loop's last decode.

Pieces, each usable alone:
- `parse_calls(text)`: the function calls in a reply, in BFCL's call syntax `[func(a=1, b='x'), other()]` (the
  syntax BFCL's default system prompt asks for; bare `func(a=1)`, a ``` fence and `<TOOLCALL>` tags are
  accepted as BFCL's own decoder accepts them) or as Hermes `<tool_call>{"name": …, "arguments": {…}}</tool_call>`
  lines. Parsed with `ast` and `ast.literal_eval` only: arguments must be literals; nothing is ever evaluated.
- `Backends`: the involved BFCL classes (file system, messaging, posting, ticketing, trading, travel, vehicle
  control, math), each instantiated and loaded from the task's `initial_config` exactly as BFCL's checker does
  (`_load_scenario(deepcopy(config), long_context=…)`; MathAPI is stateless). Calls are dispatched only to the
  public methods of these instances; results are stringified as BFCL does (dicts as JSON); an exception becomes
  `Error during execution: …`, as in BFCL. The web-search and memory backends are left out (network, faiss).
- `ClosedLoop`: per trajectory, `start(trajectory)`; per user turn, `begin_turn(i)`; after each decode,
  `after_reply(text)` → the messages to append (one `tool` message per executed call, or one error observation
  for a malformed reply) or None when the reply called no function (the user turn is over). After
  `step_limit` decodes in one user turn (BFCL's own limit, 20) the results are still returned but `turn_over`
  is set. `log` keeps, per user turn and decode step, the executed calls, their results' size in bytes, and
  errors.
- `closed_trajectory(trajectory)`: a bfcl-v3 trajectory as the closed loop runs it: BFCL's default prompting-mode
  system prompt (the function docs as JSON) prepended to the first turn, no logged replies, no native tools.
- `ClosedSession`: one loop over one trajectory on the runner's side. Every decode is one recorded turn (turn
  index = decode index across the trajectory); after the leading method's reply the session executes its calls
  and decides what follows: another step of the same user turn (calls made, step limit not reached), the next user
  turn, or the end.
- `ClosedReplay`: one method's view of a session behind the runner's `MethodReplay` interface (`has_turn`,
  `context`, `record_reply`, `replay_stored`, `turn_extra`); `closed_replays` builds them: at T=0 one session led
  by `ar` for every method (tools executed once, from `ar`'s reply; each method's reply is compared with `ar`'s),
  at T>0 one session per method (pairing with `ar` is then by turn index only).
- The `tool_calls` table (`TOOLS_SCHEMA`, stored beside turns.parquet): per (method, sample, turn) the user turn and
  step, the reply's calls, their observations' size in bytes, per call its error, whether it was executed and its
  form, a parse error, why the user turn stopped there, the loop (shared | own), `matches_ar`, and on the loop's
  last decode `solved` and `check` (BFCL's verdict).

`bfcl-eval` is an optional extra (installed with --no-deps: it pins numpy==1.26.4); `require_bfcl()` is the
one-line error without it.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd
import pyarrow as pa

from evalsuite.chat import template_features
from evalsuite.config import BFCL_INSTALL_HINT, TOOL_FORMATS
from evalsuite.conventions import BASELINE
from evalsuite.errors import UserError
from evalsuite.replay import ContextPolicy, MethodReplay, Render, TurnContext
from evalsuite.store import read_table
from evalsuite.tasks.base import Trajectory, Turn
from evalsuite.tools.bfcl_check import StateCheck, Verdict
from evalsuite.tools.native_calls import FORMAT_HINT, ToolIndex, call_text, parse_native

BACKEND_MODULES = {
    "GorillaFileSystem": "gorilla_file_system", "MathAPI": "math_api", "MessageAPI": "message_api",
    "TwitterAPI": "posting_api", "TicketAPI": "ticket_api", "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking", "VehicleControlAPI": "vehicle_control",
}
BACKEND_PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
STATELESS = ("MathAPI",)
LEFT_OUT = ("WebSearchAPI", "MemoryAPI_kv", "MemoryAPI_vector", "MemoryAPI_rec_sum")
STEP_LIMIT = 20  # bfcl_eval.constants.default_prompts.MAXIMUM_STEP_LIMIT
INSTALL_HINT = BFCL_INSTALL_HINT
CLOSED = "closed"  # the replay mode, and the replay label of closed-loop turns
SHARED, OWN = "shared", "own"  # one loop led by ar for every method (T=0) | each method its own loop (T>0)
NATIVE, PROMPT = "native", "prompt"  # --tool-format: the template's own tools and calls | BFCL's prompting mode
assert set(TOOL_FORMATS) == {NATIVE, PROMPT}
TOOLS_TABLE = "tool_calls"
TOOLS_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("method", pa.string()), ("task", pa.string()), ("sample_id", pa.string()),
    ("turn", pa.int64()), ("user_turn", pa.int64()), ("step", pa.int64()), ("calls", pa.list_(pa.string())),
    ("result_bytes", pa.list_(pa.int64())), ("errors", pa.list_(pa.string())), ("parse_error", pa.string()),
    ("stop", pa.string()), ("loop", pa.string()), ("matches_ar", pa.bool_()),
    ("executed", pa.list_(pa.bool_())), ("forms", pa.list_(pa.string())), ("solved", pa.bool_()),
    ("check", pa.string()),
])
_BARE_CALL = re.compile(r"[A-Za-z_][\w.]*\s*\(")
_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_MAX_INT = 2 ** 63


def require_bfcl(what: str = "--replay closed"):
    """The backends' package, or a one-line UserError naming the extra."""
    try:
        return importlib.import_module(BACKEND_PACKAGE)
    except ImportError as err:
        raise UserError(f"{what} needs bfcl-eval's simulated tool backends: {INSTALL_HINT}") from err


# ---- parsing --------------------------------------------------------------------------------------------------
@dataclass
class Call:
    name: str
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)

    def text(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.name}({', '.join(parts)})"


@dataclass
class ParsedReply:
    calls: list[Call]
    error: str = ""  # why a reply that tried to call functions could not be parsed
    attempted: bool = False  # the reply looks like function calls (parsed or not)


def _strip_wrapping(text: str) -> str:
    text = text.strip()
    if text.startswith("```"):
        text = text[3:]
        text = text.split("\n", 1)[1] if "\n" in text and not text.lstrip().startswith("[") else text
        text = text.rsplit("```", 1)[0] if "```" in text else text
    text = text.strip()
    for open_tag, close_tag in (("<TOOLCALL>", "</TOOLCALL>"), ("<toolcall>", "</toolcall>")):
        if text.startswith(open_tag):
            text = text[len(open_tag):]
            text = text.rsplit(close_tag, 1)[0] if close_tag in text else text
    return text.strip().strip("`").strip()


def _literal(node: ast.AST, where: str):
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as err:
        raise ValueError(f"{where} is not a literal ({ast.unparse(node)[:60]!r})") from err
    return value


def _python_calls(text: str) -> list[Call]:
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as err:
        raise ValueError(f"not valid call syntax ({getattr(err, 'msg', None) or type(err).__name__})") from err
    body = tree.body
    elements = body.elts if isinstance(body, (ast.List, ast.Tuple)) else [body]
    calls = []
    for node in elements:
        if not isinstance(node, ast.Call):
            raise ValueError(f"{ast.unparse(node)[:60]!r} is not a function call")
        plain = isinstance(node.func, ast.Name) or (isinstance(node.func, ast.Attribute)
                                                    and isinstance(node.func.value, ast.Name))
        if not plain:  # only `name(...)` or `Class.name(...)`
            raise ValueError(f"{ast.unparse(node.func)[:60]!r} is not a plain function name")
        name = ast.unparse(node.func)
        args = [_literal(a, f"an argument of {name}") for a in node.args]
        kwargs = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                raise ValueError(f"{name}: **kwargs are not accepted")
            kwargs[keyword.arg] = _literal(keyword.value, f"argument {keyword.arg} of {name}")
        calls.append(Call(name, args, kwargs))
    return calls


def _hermes_calls(blocks: list[str]) -> list[Call]:
    calls = []
    for block in blocks:
        try:
            data = json.loads(block)
        except json.JSONDecodeError as err:
            raise ValueError(f"a <tool_call> block is not JSON ({err.msg})") from err
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ValueError("a <tool_call> block needs a 'name'")
        arguments = data.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as err:
                raise ValueError(f"{data['name']}: arguments are not JSON ({err.msg})") from err
        if not isinstance(arguments, dict):
            raise ValueError(f"{data['name']}: arguments must be an object")
        calls.append(Call(data["name"], [], arguments))
    return calls


def parse_calls(text: str) -> ParsedReply:
    """The function calls of a reply. A reply that is not an attempt at calls (prose, an empty list) has none and
    ends the user turn; an attempt that does not parse has `error` set (an error observation, not a crash)."""
    blocks = _HERMES.findall(text or "")
    if blocks:
        try:
            return ParsedReply(_hermes_calls(blocks), attempted=True)
        except ValueError as err:
            return ParsedReply([], str(err), attempted=True)
    body = _strip_wrapping(text or "")
    if body.startswith("["):
        candidate = body
    elif _BARE_CALL.match(body):
        candidate = f"[{body}]"
    else:
        return ParsedReply([])
    try:
        return ParsedReply(_python_calls(candidate), attempted=True)
    except ValueError as err:
        return ParsedReply([], str(err), attempted=True)


# ---- the backends ---------------------------------------------------------------------------------------------
def _stringify(result) -> str:
    """As BFCL's execute_multi_turn_func_call: strings as they are, dicts as JSON (else str), anything else str."""
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def _guard(call: Call) -> str:
    """Arguments that would make a simulated method run away (huge integer powers): refused before the call."""
    values = list(call.args) + list(call.kwargs.values())
    if any(isinstance(v, int) and not isinstance(v, bool) and abs(v) >= _MAX_INT for v in values):
        return "an integer argument is out of range"
    if call.name.rsplit(".", 1)[-1] == "power":
        exponent = call.kwargs.get("exponent", call.args[1] if len(call.args) > 1 else None)
        if isinstance(exponent, int) and not isinstance(exponent, bool) and abs(exponent) > 10_000:
            return "the exponent is too large"
    return ""


class Backends:
    """The involved BFCL classes of one trajectory, loaded from its initial state as BFCL's checker loads them."""

    def __init__(self, involved_classes: list[str], initial_config: dict, long_context: bool = False):
        require_bfcl()
        self.instances: dict[str, object] = {}
        self.methods: dict[str, object] = {}
        for class_name in involved_classes:
            if class_name in LEFT_OUT or class_name not in BACKEND_MODULES:
                raise UserError(f"--replay closed: BFCL class {class_name} is not supported (the closed loop runs "
                                f"{', '.join(BACKEND_MODULES)})")
            module = importlib.import_module(f"{BACKEND_PACKAGE}.{BACKEND_MODULES[class_name]}")
            instance = getattr(module, class_name)()
            if class_name not in STATELESS:
                instance._load_scenario(copy.deepcopy((initial_config or {}).get(class_name, {})),
                                        long_context=long_context)
            self.instances[class_name] = instance
            for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not name.startswith("_"):
                    self.methods[name] = method  # a later class wins a shared name, as in BFCL

    def resolve(self, name: str):
        owner, _, method = name.rpartition(".")
        if owner and owner not in self.instances:
            return None
        if owner:
            bound = getattr(self.instances[owner], method, None)
            return bound if not method.startswith("_") and inspect.ismethod(bound) else None
        return self.methods.get(name)

    def execute(self, call: Call) -> tuple[str, str]:
        """(result text, error): the error is set when the call raised, was refused, or returned the backends'
        `{"error": …}`; the text is the observation either way."""
        method = self.resolve(call.name)
        if method is None:
            error = f"name '{call.name}' is not defined"
        else:
            error = _guard(call)
        if not error:
            try:
                result = method(*call.args, **call.kwargs)
            except Exception as err:  # the simulated API's own errors (wrong arguments included) are observations
                error = str(err) or type(err).__name__
            else:  # the backends report their own failures as {"error": ...}: recorded as errors too
                failed = result.get("error") if isinstance(result, dict) else None
                return _stringify(result), "" if failed is None else str(failed) or "error"
        return f"Error during execution: {error}", error


# ---- the loop -------------------------------------------------------------------------------------------------
@dataclass
class StepLog:
    step: int  # decode index within the user turn
    calls: list[str] = field(default_factory=list)  # the reply's calls, as `name(args)` (native: refused ones too)
    result_bytes: list[int] = field(default_factory=list)  # UTF-8 size of each call's observation
    errors: list[str] = field(default_factory=list)  # per call: "" or the execution error (or why it was refused)
    parse_error: str = ""  # the reply tried to call functions and could not be parsed
    executed: list[bool] = field(default_factory=list)  # per call: run against the backends (native: schema passed)
    results: list[str] = field(default_factory=list)  # the executed calls' results (BFCL's check; not stored)
    forms: list[str] = field(default_factory=list)  # per call: python (prompt) | tag | fence | bare (native)


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


class ClosedLoop:
    """The tool side of a closed BFCL loop for one trajectory; `ClosedSession` drives it.

    `tool_format` prompt: replies are parsed as BFCL call lists (`parse_calls`), results and the parse-error
    observation are `tool` messages named after the call. native: replies are parsed as the template's
    `<tool_call>` JSON blocks (`native_calls.parse_native`) and each call is checked against its tool's schema
    first (an unknown function, an unexpected or missing argument, a wrong type: an error observation, not
    executed); the reply goes into the history as the template's assistant message with `tool_calls`, each
    result (or error) as a `tool` message. `assistant` is the history message of the latest reply."""

    def __init__(self, step_limit: int = STEP_LIMIT, tool_format: str = PROMPT):
        if step_limit < 1:
            raise UserError(f"closed loop: the step limit must be >= 1, got {step_limit}")
        if tool_format not in (NATIVE, PROMPT):
            raise UserError(f"closed loop: tool format {tool_format!r}: choose {NATIVE} or {PROMPT}")
        self.step_limit, self.tool_format = step_limit, tool_format
        self.backends: Backends | None = None
        self.tools: ToolIndex | None = None
        self.log: list[TurnLog] = []
        self.turn_over = True
        self.assistant: dict | None = None

    def start(self, trajectory: Trajectory) -> None:
        """Fresh backends from the trajectory's initial state (bfcl-v3 meta: involved_classes, initial_config)."""
        meta = trajectory.meta
        if "initial_config" not in meta or "involved_classes" not in meta:
            raise UserError(f"--replay closed: sample {trajectory.sample_id} has no BFCL initial state "
                            "(the closed loop runs --task bfcl-v3)")
        self.backends = Backends(list(meta["involved_classes"]), meta["initial_config"],
                                 bool(meta.get("long_context")))
        self.tools = ToolIndex(trajectory.tools or [], backend_names(trajectory))
        self.log = []
        self.turn_over = True

    def begin_turn(self, index: int) -> None:
        if self.backends is None:
            raise RuntimeError("ClosedLoop.start(trajectory) first")
        self.log.append(TurnLog(index))
        self.turn_over = False

    @property
    def current(self) -> TurnLog:
        return self.log[-1]

    def end_turn(self, stop: str) -> None:
        self.current.stop = stop
        self.turn_over = True

    def after_reply(self, text: str) -> list[dict] | None:
        """Execute the reply's calls: the messages to append after the reply (tool results, or error
        observations), or None when the reply called no function (the user turn is over). At the step limit the
        results still come back and `turn_over` is set."""
        if self.turn_over:
            raise RuntimeError("after_reply outside a user turn: call begin_turn first")
        turn = self.current
        step = StepLog(len(turn.steps))
        turn.steps.append(step)
        self.assistant = {"role": "assistant", "content": text}
        messages = self._native(text, step) if self.tool_format == NATIVE else self._prompt(text, step)
        if messages is None:
            self.end_turn("no_calls")
            return None
        if len(turn.steps) >= self.step_limit:
            self.end_turn("step_limit")
        return messages

    def _run(self, step: StepLog, call: Call, shown: str, form: str = "python") -> str:
        result, error = self.backends.execute(call)
        step.forms.append(form)
        step.calls.append(shown)
        step.result_bytes.append(len(result.encode("utf-8")))
        step.errors.append(error)
        step.executed.append(True)
        step.results.append(result)
        return result

    def _prompt(self, text: str, step: StepLog) -> list[dict] | None:
        parsed = parse_calls(text)
        if not parsed.attempted or (not parsed.calls and not parsed.error):
            return None
        messages = []
        if parsed.error:
            step.parse_error = parsed.error
            messages.append({"role": "tool", "name": "error",
                             "content": f"Error: the function calls could not be parsed: {parsed.error}. Write "
                                        f"them as [func_name(param=value, ...), ...]."})
        for call in parsed.calls:
            messages.append({"role": "tool", "name": call.text(), "content": self._run(step, call, call.text())})
        return messages

    def _native(self, text: str, step: StepLog) -> list[dict] | None:
        reply = parse_native(text)
        if not reply.attempted:
            return None
        if reply.errors:
            step.parse_error = "; ".join(reply.errors)
        else:  # every block is a call: the template's own assistant message
            self.assistant = {"role": "assistant", "content": reply.content, "tool_calls": [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in reply.calls]}
        messages = []
        for block in reply.blocks:
            if block.call is None:
                messages.append({"role": "tool", "name": "error",
                                 "content": f"Error: {block.error}. {FORMAT_HINT}"})
                continue
            name, arguments = block.call.name, block.call.arguments
            backend, refused = self.tools.check(name, arguments)
            shown = call_text(name, arguments)
            if refused:
                observation = f"Error: {refused}"
                step.forms.append(block.call.form)
                step.calls.append(shown)
                step.result_bytes.append(len(observation.encode("utf-8")))
                step.errors.append(refused)
                step.executed.append(False)
            else:
                observation = self._run(step, Call(backend, [], dict(arguments)), shown, block.call.form)
            messages.append({"role": "tool", "name": name, "content": observation})
        if reply.unclosed:
            messages.append({"role": "tool", "name": "error",
                             "content": f"Error: a <tool_call> is never closed with </tool_call>. {FORMAT_HINT}"})
        return messages


# ---- the trajectory and the replay ----------------------------------------------------------------------------
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


def resolve_tool_format(requested: str | None, template: str | None) -> str:
    """--tool-format: as given, or (None/auto) native where the chat template takes `tools`, else prompt."""
    if requested not in (None, "", "auto"):
        return requested
    return NATIVE if template and template_features(template)["tools"] else PROMPT


def closed_trajectory(trajectory: Trajectory, tool_format: str = PROMPT) -> Trajectory:
    """The trajectory as the closed loop runs it: the user turns, no logged replies; prompt: BFCL's prompting-mode
    system prompt first and no native tools; native: the function docs as the template's tools (BFCL's FC
    conversion, tasks/bfcl_v3.py `bfcl_tool`) and no system message of ours (BFCL's FC handlers add none: the
    template's own default system prompt and tool block frame the tools)."""
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


class ClosedSession:
    """One closed loop over one (closed) trajectory, driven by one method's replies, the *leader*. Decode i of the
    loop is turn i of the records; `where[i]` is its (user turn, step within it).

    After the leader's reply to decode i the session executes its calls and decides what follows: another step of
    the same user turn (calls were made and the step limit is not reached: the context is the history plus the
    results), the next user turn, or the end. Other methods may follow the same session (`shared`, at T=0): they
    get the leader's contexts, their replies are only compared with the leader's (`matches_ar`)."""

    def __init__(self, trajectory: Trajectory, policy: ContextPolicy, render: Render, leader: str, shared: bool,
                 max_decodes: int | None = None, step_limit: int = STEP_LIMIT, tool_format: str = PROMPT):
        self.trajectory = trajectory  # as closed_trajectory() makes it
        self.policy, self.render, self.leader, self.shared = policy, render, leader, shared
        self.max_decodes = max_decodes
        self.loop = ClosedLoop(step_limit, tool_format)
        self.loop.start(trajectory)
        truth = trajectory.meta.get("ground_truth")
        self.check = StateCheck(trajectory.meta, truth) if truth is not None else None
        self.verdict: Verdict | None = None  # BFCL's state-based check, once the loop ended
        self.history: list[dict] = []
        self.contexts: dict[int, TurnContext] = {}
        self.where: dict[int, tuple[int, int]] = {}
        self.steps: dict[int, StepLog] = {}  # what the leader's reply to each decode executed
        self.stops: dict[int, str] = {}  # "" (another step follows) | no_calls | step_limit | skipped | max_turns
        self.replies: dict[int, dict[str, str | None]] = {}
        self.decoded = 0  # decodes the leader has replied to
        self.next: tuple[int, int] | None = (0, 0) if trajectory.turns else None
        self.broken = ""
        self._tail = 0  # messages the latest step added (protected from truncate-left)

    def has_turn(self, index: int) -> bool:
        return index < self.decoded or (index == self.decoded and self.next is not None)

    def context(self, index: int) -> TurnContext:
        if index in self.contexts:
            return self.contexts[index]
        if index != self.decoded or self.next is None:
            raise RuntimeError(f"closed loop: decode {index} does not follow (the leader has replied to "
                               f"{self.decoded} decodes)")
        user_turn, step = self.where[index] = self.next
        pairing = "" if self.shared else "turn_index"
        if self.broken:
            context = TurnContext(CLOSED, [], skip_reason=self.broken, pairing=pairing)
        else:
            if step == 0:
                messages = self.trajectory.turns[user_turn].new_messages
                self.history.extend(messages)
                self._tail = len(messages)
                self.loop.begin_turn(user_turn)
            ids, dropped_messages, dropped_tokens, skip = self.policy.fit_messages(self.history, self._tail,
                                                                                  self.render)
            context = TurnContext(CLOSED, ids, dropped_messages, dropped_tokens, skip, pairing)
        self.contexts[index] = context
        return context

    def record(self, index: int, method: str, text: str | None) -> None:
        self.replies.setdefault(index, {})[method] = text
        if method != self.leader:
            return
        if index != self.decoded or index not in self.where:
            raise RuntimeError(f"closed loop: a reply to decode {index} before its context")
        user_turn, step = self.where[index]
        follows = False
        if self.broken or text is None:
            self.broken = self.broken or (f"decode {index} (user turn {user_turn}) was skipped, so the closed loop "
                                          "has no history to continue from")
            if not self.loop.turn_over:
                self.loop.end_turn("skipped")
            self.steps[index], stop = StepLog(step), "skipped"
        else:
            messages = self.loop.after_reply(text)  # executes the calls (or the error observation)
            self.history.append(self.loop.assistant)
            self.steps[index] = self.loop.current.steps[-1]
            if messages is not None:
                self.history.extend(messages)
                self._tail = len(messages)
            follows = messages is not None and not self.loop.turn_over
            stop = "" if follows else self.loop.current.stop
            if not follows:
                self._check_turn(self.loop.current)
        self.decoded = index + 1
        if follows:
            self.next = (user_turn, step + 1)
        elif user_turn + 1 < len(self.trajectory.turns):
            self.next = (user_turn + 1, 0)
        else:
            self.next = None
        if self.next is not None and self.max_decodes is not None and self.decoded >= self.max_decodes:
            self.next, stop = None, stop or "max_turns"
        self.stops[index] = stop
        if self.next is None and self.check is not None:
            reason = self.broken or ("--max-turns ended the loop" if stop == "max_turns" else "")
            self.verdict = self.check.finish(reason)

    def _check_turn(self, turn: TurnLog) -> None:
        """A user turn is over: BFCL's check of the backends' state after it (the step limit fails the entry, as
        BFCL's force-quit does)."""
        if self.check is None:
            return
        self.check.end_turn(turn.turn, self.loop.backends, turn.calls, turn.results)
        if turn.stop == "step_limit" and self.check.verdict is None:
            self.check.verdict = Verdict(False, "multi_turn:force_terminated",
                                         f"the step limit ({self.loop.step_limit} decodes) ended the turn", turn.turn)

    def row(self, index: int, method: str) -> dict:
        """The tool_calls row of decode `index` for `method` (TOOLS_SCHEMA, less the key columns)."""
        user_turn, step = self.where[index]
        log = self.steps.get(index, StepLog(step))
        replies = self.replies.get(index, {})
        mine, leader = replies.get(method), replies.get(self.leader)
        matches = None
        if self.shared and method != self.leader and mine is not None and leader is not None:
            matches = mine == leader
        solved, check = None, ""
        if self.verdict is not None and index == self.decoded - 1 and self.next is None:  # the loop's last decode
            solved, check = self.verdict.valid, self.verdict.text()
            differs = [i for i, r in self.replies.items() if method != self.leader and method in r
                       and r[method] is not None and r[method] != r.get(self.leader)]
            if differs:  # this method's own replies would have led elsewhere: its score is unknown
                solved, check = None, (f"not scored: its replies to decodes {differs[:5]} differ from "
                                       f"{self.leader}'s, whose loop ran ({check})")
        return {"user_turn": user_turn, "step": step, "calls": list(log.calls), "result_bytes": list(log.result_bytes),
                "errors": list(log.errors), "parse_error": log.parse_error, "stop": self.stops.get(index, ""),
                "loop": SHARED if self.shared else OWN, "matches_ar": matches, "executed": list(log.executed),
                "forms": list(log.forms), "solved": solved, "check": check}


class ClosedReplay(MethodReplay):
    """One method's view of a closed loop (`--replay closed`), behind the runner's `MethodReplay` interface:
    `has_turn(i)` (known for i + 1 once the leader has replied to i), `context(i)`, `record_reply(i, text)` and
    `turn_extra(i)` (the turn's tool_calls row); `replay_stored` (resume) re-executes the stored reply's calls."""

    def __init__(self, session: ClosedSession, method: str):
        self.session, self.method = session, method
        self.trajectory, self.mode = session.trajectory, CLOSED
        self.policy, self.render = session.policy, session.render
        self.history = session.history
        self.logged_replies = self.model_replies = 0
        self.broken = ""

    def has_turn(self, index: int) -> bool:
        return self.session.has_turn(index)

    def context(self, index: int) -> TurnContext:
        return self.session.context(index)

    def record_reply(self, index: int, text: str | None) -> None:
        self.session.record(index, self.method, text)

    def turn_extra(self, index: int) -> dict[str, tuple[dict, pa.Schema]]:
        return {TOOLS_TABLE: (self.session.row(index, self.method), TOOLS_SCHEMA)}


def closed_replays(trajectory: Trajectory, methods, policy: ContextPolicy, render_for: Callable[[Trajectory], Render],
                   temperature: float, max_turns: int | None = None, step_limit: int = STEP_LIMIT,
                   tool_format: str = PROMPT) -> dict[str, ClosedReplay]:
    """Every method's closed replay of one bfcl-v3 trajectory. At T=0 the methods are lossless: one loop, led by
    `ar` (its replies' calls are executed once), whose contexts every method decodes; at T>0 each method runs its
    own loop (own backends), so turn i of two methods may have different contexts. `max_turns` caps the decodes."""
    closed = closed_trajectory(trajectory, tool_format)
    render = render_for(closed)
    methods = list(methods)
    if temperature == 0:
        leader = BASELINE if BASELINE in methods else methods[0]
        session = ClosedSession(closed, policy, render, leader, True, max_turns, step_limit, tool_format)
        return {m: ClosedReplay(session, m) for m in methods}
    return {m: ClosedReplay(ClosedSession(closed, policy, render, m, False, max_turns, step_limit, tool_format), m)
            for m in methods}


PROMPTS = {
    PROMPT: "BFCL prompting mode: python call syntax, the function docs as JSON in the system prompt",
    NATIVE: ("the template's native tools (BFCL's FC mode): the function docs as JSON-schema tools rendered by the chat "
             "template, calls as <tool_call> JSON (also accepted: the same JSON call objects in a ``` fence or bare, "
             "tool_calls.forms) checked against their schema, results as tool messages"),
}


def describe_closed_loop(temperature: float, tool_format: str = PROMPT, step_limit: int = STEP_LIMIT,
                         rendering: str = "") -> dict:
    """run.json's `closed_loop`: how the loop ran and what `speedup_turn` pairs."""
    shared = temperature == 0
    try:
        from importlib.metadata import version

        backend = f"bfcl-eval {version('bfcl-eval')}"
    except Exception:  # noqa: BLE001 - metadata of a --no-deps install may be missing
        backend = "bfcl-eval"
    return {"closed_loop": {
        "loop": SHARED if shared else OWN,
        "pairing": ("ar's loop, replayed for every method: each turn is paired with ar's decode of the same context; "
                    "tool_calls.matches_ar records whether each method's reply equals ar's") if shared else
                   ("by turn index only: at T>0 every method runs its own loop (its own calls executed), so ar's "
                    "decode of the same turn index saw another context (turns.pairing = turn_index)"),
        "step_limit": step_limit,
        "tool_format": tool_format,
        "prompt": PROMPTS[tool_format] + (f" ({rendering})" if rendering else ""),
        "check": ("BFCL's state-based multi-turn check against possible_answer (bfcl-eval's state_checker and "
                  "response_checker after each user turn; the calls executed by the loop, never eval'd): "
                  "tool_calls.solved on each loop's last decode"),
        "backends": backend,
        "resume": "stored turns are replayed: their stored replies' calls are re-executed against fresh backends",
        "table": f"{TOOLS_TABLE}.parquet: per turn the calls, executed or refused, their results' bytes, errors, "
                 "forms, stop; solved and check on each loop's last decode",
    }}


def read_tool_calls(run_dir) -> pd.DataFrame:
    """The tool_calls rows of a closed-loop run (empty for any other run)."""
    return read_table(Path(run_dir), TOOLS_TABLE, TOOLS_SCHEMA)
