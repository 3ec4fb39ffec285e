"""BFCL's simulated backends for one trajectory: the involved classes (file system, messaging, posting, ticketing,
trading, travel, vehicle control, math), each instantiated and loaded from the task's `initial_config` exactly as
BFCL's checker does (`_load_scenario(deepcopy(config), long_context=…)`; MathAPI is stateless). Calls are dispatched
only to the public methods of these instances; results are stringified as BFCL does (dicts as JSON); an exception
becomes `Error during execution: …`, as in BFCL. The web-search and memory backends are left out (network, faiss).

`bfcl-eval` is an optional extra (installed with --no-deps: it pins numpy==1.26.4); `require_bfcl()` is the one-line
error without it.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json

from evalsuite.errors import UserError
from evalsuite.tasks.bfcl_v3.calls import Call
from evalsuite.tasks.bfcl_v3.data import CLASS_DOC

BACKEND_MODULES = CLASS_DOC  # each class's module in bfcl-eval is named as its function-doc file
BACKEND_PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
STATELESS = ("MathAPI",)
LEFT_OUT = ("WebSearchAPI", "MemoryAPI_kv", "MemoryAPI_vector", "MemoryAPI_rec_sum")
INSTALL_HINT = ("pip install 'evalsuite[bfcl]' && pip install --no-deps bfcl-eval==2026.3.23 "
                "(--no-deps: bfcl-eval pins numpy==1.26.4)")
_MAX_INT = 2 ** 63


def require_bfcl(what: str = "--replay closed"):
    """The backends' package, or a one-line UserError naming the extra."""
    try:
        return importlib.import_module(BACKEND_PACKAGE)
    except ImportError as err:
        raise UserError(f"{what} needs bfcl-eval's simulated tool backends: {INSTALL_HINT}") from err


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
