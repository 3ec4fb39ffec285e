"""BFCL's prompting-mode calls in a reply: `[func(a=1, b='x'), other()]`, the syntax BFCL's default system prompt asks
for (bare `func(a=1)`, a ``` fence and `<TOOLCALL>` tags are accepted as BFCL's own decoder accepts them), or Hermes
`<tool_call>{"name": …, "arguments": {…}}</tool_call>` lines. Parsed with `ast` and `ast.literal_eval` only:
arguments must be literals; nothing is ever evaluated. (The template's native format: native_calls.py.)
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field

_BARE_CALL = re.compile(r"[A-Za-z_][\w.]*\s*\(")
_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


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


def python_calls(text: str) -> list[Call]:
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
        return ParsedReply(python_calls(candidate), attempted=True)
    except ValueError as err:
        return ParsedReply([], str(err), attempted=True)
