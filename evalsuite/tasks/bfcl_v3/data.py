"""BFCL v3 multi-turn (base, long_context): one turn per user message, function docs as the template's tools.

Tools are built from `multi_turn_func_doc/<class>.json` for each involved class, transformed as BFCL does before
sending native tools (its `func_doc_language_specific_pre_processing` + `convert_to_tool`): the Python-syntax
hint appended to each description, "." → "_" in names, parameters.type "object", and the Gorilla → OpenAPI type
map (a float also gets `format: float` and " This is a float type value."). The target's chat template renders
them (see `evalsuite.target.chat` for templates without tool support).

Logged replay (the default) uses the ground-truth calls of turn k (`possible_answer/…`, python call strings)
as turn k's assistant message, as OpenAI-style tool calls; positional arguments take the parameter names in the
function doc's order. The files hold no tool observations (BFCL produces them by executing its simulated API
classes, not bundled), so none are inserted. `long_context` differs from `base` only in those executed
observations, so without them both replay alike.

`meta` keeps what the closed loop needs to execute the target's own calls (environment.py, `--replay closed`):
`involved_classes`, `initial_config` (each class's initial state), the raw `function_docs` and `long_context` (BFCL
loads the long-context states for that category), and `ground_truth` (the possible_answer call strings per turn,
for BFCL's state-based check of the loop's final state, check.py).
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.tasks._source import local_path, read_records
from evalsuite.tasks.base import LoadOptions, Trajectory, Turn, register_task, seeded_subset
from evalsuite.tasks.description import describe

TASK = describe("bfcl-v3")  # tasks/bfcl_v3/task.toml: name, licence, source, subsets and their files, turns, scoring
BUNDLED = TASK.folder
SUBSETS = TASK.subset_names
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
CLASS_DOC = {
    "GorillaFileSystem": "gorilla_file_system", "MathAPI": "math_api", "MessageAPI": "message_api",
    "TwitterAPI": "posting_api", "TicketAPI": "ticket_api", "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking", "VehicleControlAPI": "vehicle_control",
}
GORILLA_TO_OPENAPI = {
    "integer": "integer", "number": "number", "float": "number", "string": "string", "boolean": "boolean",
    "bool": "boolean", "array": "array", "list": "array", "dict": "object", "object": "object", "tuple": "array",
    "any": "string", "byte": "integer", "short": "integer", "long": "integer", "double": "number", "char": "string",
    "ArrayList": "array", "Array": "array", "HashMap": "object", "Hashtable": "object", "Queue": "array",
    "Stack": "array", "Any": "string", "String": "string", "Bigint": "integer",
}


def _openapi_properties(properties: dict) -> dict:
    for value in properties.values():
        gorilla = value.get("type")
        if gorilla == "float":
            value["format"] = "float"
            value["description"] = value.get("description", "") + " This is a float type value."
        value["type"] = GORILLA_TO_OPENAPI.get(gorilla, "string")
        if value["type"] in ("array", "object"):
            if "properties" in value:
                _openapi_properties(value["properties"])
            elif "items" in value:
                items = value["items"]
                items["type"] = GORILLA_TO_OPENAPI.get(items.get("type"), "string")
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = GORILLA_TO_OPENAPI.get(items["items"].get("type"), "string")
                elif items["type"] == "object" and "properties" in items:
                    _openapi_properties(items["properties"])
    return properties


def bfcl_tool(doc: dict) -> dict:
    """One BFCL function doc → the OpenAI tool BFCL sends."""
    function = copy.deepcopy(doc)
    function["description"] = function.get("description", "") + PYTHON_HINT
    function["name"] = function["name"].replace(".", "_")
    function["parameters"]["type"] = "object"
    _openapi_properties(function["parameters"].setdefault("properties", {}))
    return {"type": "function", "function": function}


def call_from_python(text: str, docs: dict[str, dict], where: str) -> dict:
    """`mv(source='a', destination='b')` → an OpenAI tool call with keyword arguments."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, (ast.Name, ast.Attribute)):
            raise ValueError("not a function call")
        name = ast.unparse(node.func)
        arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
        positional = [ast.literal_eval(a) for a in node.args]
    except (SyntaxError, ValueError) as err:
        raise UserError(f"{where}: ground-truth call {text!r:.80} is not a python call with literal arguments") from err
    if positional:
        names = list(docs.get(name, {}).get("parameters", {}).get("properties", {}))
        if len(positional) > len(names):
            raise UserError(f"{where}: call {text!r:.80} has more positional arguments than {name} has parameters")
        arguments = {**dict(zip(names, positional)), **arguments}
    return {"type": "function", "function": {"name": name.replace(".", "_"), "arguments": arguments}}


def _class_docs(root: Path, classes: list[str], where: str) -> list[dict]:
    docs = []
    for cls in classes:
        if cls not in CLASS_DOC:
            raise UserError(f"{where}: unknown BFCL class {cls!r}")
        docs += [row for _, row in read_records(root / "multi_turn_func_doc" / f"{CLASS_DOC[cls]}.json")]
    return docs


def _files(options: LoadOptions) -> tuple[Path, Path, Path]:
    subset = options.subset or TASK.default_subset
    if subset not in SUBSETS:
        raise UserError(f"--subset {subset}: bfcl-v3 has subsets {', '.join(SUBSETS)}")
    if options.data_path is None:
        root = BUNDLED
    else:
        root = local_path(options.data_path)
        if not root.is_dir():
            raise UserError(f"--data-path {root}: bfcl-v3 expects BFCL's data directory (bfcl_eval/data of "
                            f"`pip install bfcl-eval`, or the gorilla repo), holding BFCL_v3_multi_turn_*.json")
    name = f"BFCL_v3_multi_turn_{subset}.json"
    if not (root / name).exists() and (root / name.replace("v3", "v4")).exists():
        name = name.replace("v3", "v4")  # bfcl-eval >= 2025.8 renamed the files; the format is unchanged
    question, answer = root / name, root / "possible_answer" / name
    for path in (question, answer, root / "multi_turn_func_doc"):
        if not path.exists():
            raise UserError(f"bfcl-v3: {path} is missing; --data-path must hold BFCL's data directory layout")
    return root, question, answer


@register_task(TASK)
def load(options: LoadOptions) -> list[Trajectory]:
    root, question_file, answer_file = _files(options)
    answers = {}
    for where, row in read_records(answer_file):
        if not isinstance(row.get("id"), str) or not isinstance(row.get("ground_truth"), list):
            raise UserError(f"{where}: possible-answer record needs 'id' and a 'ground_truth' list")
        answers[row["id"]] = row["ground_truth"]
    trajectories = []
    for where, row in read_records(question_file):
        sample_id, turns_in = row.get("id"), row.get("question")
        if not isinstance(sample_id, str) or not isinstance(turns_in, list) or not turns_in:
            raise UserError(f"{where}: record needs 'id' and a non-empty 'question' list of turns")
        classes = row.get("involved_classes") or []
        docs = _class_docs(root, classes, where)
        by_name = {d["name"]: d for d in docs}
        truth = answers.get(sample_id, [])
        turns = []
        for k, messages in enumerate(turns_in):
            if not isinstance(messages, list) or not messages or not all(
                    isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str)
                    and m["content"].strip() for m in messages):
                raise UserError(f"{where} turn {k}: each turn must be a list of non-empty user messages")
            calls = truth[k] if k < len(truth) else []
            reply = None
            if calls:
                reply = {"role": "assistant", "content": "",
                         "tool_calls": [call_from_python(c, by_name, f"{answer_file} {sample_id} turn {k}")
                                        for c in calls]}
            turns.append(Turn(new_messages=[dict(m) for m in messages], logged_reply=reply))
        meta = {"involved_classes": classes, "initial_config": row.get("initial_config") or {},
                "function_docs": docs, "long_context": "long_context" in sample_id, "ground_truth": truth,
                "logged_by": "BFCL's ground-truth calls (possible_answer)"}
        trajectories.append(Trajectory(sample_id, turns, tools=[bfcl_tool(d) for d in docs], meta=meta))
    return seeded_subset(trajectories, options.limit, options.seed)
