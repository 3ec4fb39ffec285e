"""Function calls in the target's own tool-calling format (`--tool-format native`): the Hermes/Qwen convention
chat templates with `tools` print, `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, one block per call.

- `ToolIndex(tools)`: the tools a trajectory passes to the template (OpenAI-style `{"type": "function", "function":
  {name, description, parameters}}`, JSON-schema parameters), by the name the model sees, with the backend name each
  stands for (BFCL's FC conversion turns "." into "_").
- `parse_native(text)`: the blocks of a reply, each parsed with `json.loads` only (NaN/Infinity refused), nothing
  else. A block that is not a JSON object with a string `name` and an object `arguments` (or a JSON string of one),
  and a `<tool_call>` the reply never closes, are parse errors; text outside the blocks is the reply's content.
  A reply without any `<tool_call>` tag may still hold the same JSON call objects (one, or a list of them) in
  ``` fences, or be bare JSON (one call object, a list of them, or several one after another; the first JSON value
  that is not a call ends them, e.g. a tool response the model goes on to write itself): those are calls too,
  recorded with their `form` (`tag` | `fence` | `bare`; BFCL's own FC decoders take only tags, so a strict count
  keeps `tag` only). Small instruct models
  (Qwen2.5-Coder-0.5B) write their calls in a ```json fence more often than in the template's tags. Anything else
  (prose, code, python calls) calls nothing: the user turn is over.
- `ToolIndex.check(name, arguments)`: the call against its tool's schema: a known function, no unexpected argument,
  every required one, JSON-schema types (string, integer, number, boolean, array, object, null; an integer is a
  number, a bool is neither), array items, nested object properties and `enum`. A call that fails is not executed:
  it becomes an error observation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
TAG, FENCE, BARE = "tag", "fence", "bare"
FORMAT_HINT = 'Write each call as <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
_JSON_TYPES = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
    "object": (dict,), "null": (type(None),),
}


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def loads(text: str):
    """Strict JSON: the standard parser, without the NaN/Infinity extension."""
    return json.loads(text, parse_constant=_no_constant)


@dataclass
class NativeCall:
    name: str  # as the model wrote it
    arguments: dict
    form: str = TAG  # tag | fence | bare: how the reply wrote it


@dataclass
class NativeBlock:
    call: NativeCall | None = None
    error: str = ""  # why the block is not a call


@dataclass
class NativeReply:
    blocks: list[NativeBlock] = field(default_factory=list)
    content: str = ""  # the text outside the blocks
    unclosed: bool = False  # a <tool_call> the reply never closes (cut by the token budget, or never written)

    @property
    def attempted(self) -> bool:
        return bool(self.blocks) or self.unclosed

    @property
    def errors(self) -> list[str]:
        found = [b.error for b in self.blocks if b.error]
        if self.unclosed:
            found.append("a <tool_call> is never closed with </tool_call>")
        return found

    @property
    def calls(self) -> list[NativeCall]:
        return [b.call for b in self.blocks if b.call is not None]


def _block(text: str) -> NativeBlock:
    try:
        data = loads(text.strip())
    except (ValueError, RecursionError) as err:
        reason = err.msg if isinstance(err, json.JSONDecodeError) else str(err) or type(err).__name__
        return NativeBlock(error=f"a <tool_call> block is not JSON ({reason})")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return NativeBlock(error='a <tool_call> block needs a JSON object with a "name"')
    arguments = data.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return NativeBlock(error=f"{data['name']}: its arguments are a string that is not JSON")
    if not isinstance(arguments, dict):
        return NativeBlock(error=f'{data["name"]}: "arguments" must be a JSON object')
    return NativeBlock(NativeCall(data["name"], arguments))


def _looks_like_calls(body: str) -> bool:
    return body.lstrip().startswith(("{", "[")) and '"name"' in body


def _is_call(value) -> bool:
    return isinstance(value, dict) and "name" in value and ("arguments" in value or len(value) == 1)


def _json_values(body: str) -> tuple[list, str]:
    """The JSON values at the start of `body`, one after another (JSON Lines style), and the parse error of the first
    one when none parses."""
    decoder = json.JSONDecoder(parse_constant=_no_constant)
    values, position, error = [], 0, ""
    while True:
        while position < len(body) and body[position].isspace():
            position += 1
        if position >= len(body):
            break
        try:
            value, position = decoder.raw_decode(body, position)
        except (ValueError, RecursionError) as err:
            if not values:
                error = err.msg if isinstance(err, json.JSONDecodeError) else str(err) or type(err).__name__
            break  # text after the calls (prose, or a tool response the model wrote itself) is not a call
        values.append(value)
    return values, error


def _json_calls(body: str, form: str) -> list[NativeBlock]:
    """The call objects at the start of one fenced or bare JSON body: one, a list, or several one after another;
    the first value that is not a call object ends them (a model that goes on to write the tool's response itself
    has not called anything more). [] when the body is no attempt at a call."""
    values, error = _json_values(body)
    if error:
        return [NativeBlock(error=f"a JSON call is not valid JSON ({error})")] if _looks_like_calls(body) else []
    items = []
    for value in values:
        group = value if isinstance(value, list) and value and all(_is_call(v) for v in value) else [value]
        if not all(_is_call(v) for v in group):
            break
        items += group
    blocks = [_block(json.dumps(item)) for item in items]
    for block in blocks:
        if block.call is not None:
            block.call.form = form
    return blocks


def parse_native(text: str | None) -> NativeReply:
    text = text or ""
    reply = NativeReply()
    if OPEN not in text:
        fences = list(_FENCE.finditer(text))
        if fences:
            for match in fences:
                reply.blocks += _json_calls(match.group(2), FENCE)
        elif _looks_like_calls(text):
            reply.blocks = _json_calls(text, BARE)
        if reply.blocks:
            reply.content = _FENCE.sub("", text).strip() if fences else ""
        return reply
    outside, position = [], 0
    for match in _BLOCK.finditer(text):
        outside.append(text[position:match.start()])
        reply.blocks.append(_block(match.group(1)))
        position = match.end()
    rest = text[position:]
    if OPEN in rest:
        reply.unclosed = True
        rest = rest[:rest.index(OPEN)]
    outside.append(rest)
    reply.content = "".join(outside).strip()
    return reply


def call_text(name: str, arguments: dict) -> str:
    """A call as the records show it: `name({json arguments})`."""
    return f"{name}({json.dumps(arguments, ensure_ascii=False, sort_keys=False)})"


def _kind(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object", type(None): "null"}.get(type(value), type(value).__name__)


def type_error(schema: dict, value, where: str) -> str:
    """Why `value` does not fit the JSON schema `schema` ("" when it does)."""
    if not isinstance(schema, dict):
        return ""
    wanted = schema.get("type")
    types = [wanted] if isinstance(wanted, str) else list(wanted or [])
    if types:
        fits = any(t in _JSON_TYPES and isinstance(value, _JSON_TYPES[t])
                   and not (isinstance(value, bool) and t != "boolean") for t in types)
        if not fits:
            return f"{where} must be {' or '.join(types)}, got {_kind(value)}"
    if "enum" in schema and isinstance(schema["enum"], list) and value not in schema["enum"]:
        return f"{where} must be one of {json.dumps(schema['enum'])[:120]}"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            error = type_error(schema["items"], item, f"{where}[{i}]")
            if error:
                return error
    if isinstance(value, dict) and isinstance(schema.get("properties"), dict):
        for key, sub in schema["properties"].items():
            if key in value:
                error = type_error(sub, value[key], f"{where}.{key}")
                if error:
                    return error
    return ""


class ToolIndex:
    """The tools of one trajectory by the name the model sees: (backend name, JSON-schema parameters)."""

    def __init__(self, tools: list[dict], backend_names: dict[str, str] | None = None):
        self.tools: dict[str, tuple[str, dict]] = {}
        for tool in tools or []:
            function = tool.get("function", tool)
            name = function["name"]
            self.tools[name] = ((backend_names or {}).get(name, name), function.get("parameters") or {})

    def check(self, name: str, arguments: dict) -> tuple[str, str]:
        """(backend name, error): the error is "" when the call fits its tool's schema."""
        if name not in self.tools:
            return name, f"'{name}' is not one of the provided functions"
        backend, parameters = self.tools[name]
        properties = parameters.get("properties") or {}
        unexpected = [k for k in arguments if k not in properties]
        if unexpected:
            return backend, f"{name}: unexpected argument '{unexpected[0]}'"
        missing = [k for k in parameters.get("required") or [] if k not in arguments]
        if missing:
            return backend, f"{name}: missing required argument '{missing[0]}'"
        for key, value in arguments.items():
            error = type_error(properties[key], value, f"{name}: argument '{key}'")
            if error:
                return backend, error
        return backend, ""
