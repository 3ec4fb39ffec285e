"""BFCL's state-based multi-turn check of a closed loop, turn by turn, with bfcl-eval's own sub-checkers.

BFCL scores a multi-turn entry (`bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker.multi_turn_checker`) by
executing, turn by turn, the model's decoded calls on one set of backends and the entry's ground-truth calls
(`possible_answer`) on another, both loaded from the entry's initial state; after each turn whose ground truth is
not empty it requires (1) the model to have called something in that turn, (2) `state_checker`: every backend's
public attributes equal to the ground truth's, and (3) `response_checker`: every ground-truth result of that turn
among the model's results so far (all turns). An entry whose model ran fewer turns than the ground truth has
(BFCL's force-terminated inference, e.g. the step limit) fails.

`multi_turn_checker` itself executes call strings with `eval`, which is never done here on anything the model
wrote. `StateCheck` follows the same procedure with the loop's own backends (the model's calls, executed by
`Backends.execute`, dispatched to the backends' public methods only) and a second set for the ground truth (its
python-call strings, bundled data, parsed with `ast` literals by `calls.python_calls`), and calls bfcl-eval's
`state_checker` and `response_checker` on them. Its verdict is BFCL's (`valid`, `error_type` as BFCL names them).
"""

from __future__ import annotations

import importlib

from evalsuite.tasks.bfcl_v3.backends import Backends
from evalsuite.tasks.bfcl_v3.calls import python_calls
from evalsuite.tasks.environment import Verdict

CHECKER_MODULE = "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker"


def _checkers():
    module = importlib.import_module(CHECKER_MODULE)
    return module.state_checker, module.response_checker


class StateCheck:
    """BFCL's multi-turn check of one entry, fed at the end of each user turn of the loop."""

    def __init__(self, meta: dict, ground_truth: list[list[str]]):
        self.ground_truth = [list(turn) for turn in ground_truth]
        self.truth = Backends(list(meta["involved_classes"]), meta["initial_config"], bool(meta.get("long_context")))
        self.model_results: list[str] = []  # every executed call's result so far, all turns
        self.turns_checked = 0
        self.verdict: Verdict | None = None

    def end_turn(self, turn: int, backends, decoded_calls: int, results: list[str]) -> None:
        """User turn `turn` is over: `backends` hold the model's state after it, `decoded_calls` the calls its
        replies decoded to (executed or refused), `results` the executed calls' results in order."""
        self.turns_checked = max(self.turns_checked, turn + 1)
        self.model_results.extend(results)
        if self.verdict is not None or turn >= len(self.ground_truth):
            return
        truth_calls = self.ground_truth[turn]
        truth_results = []
        for text in truth_calls:
            try:
                call, = python_calls(f"[{text}]")
            except ValueError as err:
                self.verdict = Verdict(False, "ground_truth_unparsable", f"{text!r:.80}: {err}", turn)
                return
            truth_results.append(self.truth.execute(call)[0])
        if not truth_calls:
            return  # BFCL checks nothing after a turn whose ground truth is empty
        if decoded_calls == 0:
            self.verdict = Verdict(False, "multi_turn:empty_turn_model_response",
                                   f"Model response list is empty for turn {turn}", turn)
            return
        state_checker, response_checker = _checkers()
        state = state_checker(backends.instances, self.truth.instances)
        if not state["valid"]:
            self.verdict = Verdict(False, state["error_type"], state["error_message"], turn)
            return
        response = response_checker(list(self.model_results), truth_results, turn)
        if not response["valid"]:
            self.verdict = Verdict(False, response["error_type"], response["error_message"], turn)

    def finish(self, reason: str = "") -> Verdict:
        """The entry's verdict once the loop ended; `reason` when it ended early (step limit, --max-turns, a skipped
        decode): BFCL fails an entry whose inference did not run every turn."""
        if self.verdict is None:
            if reason or self.turns_checked < len(self.ground_truth):
                self.verdict = Verdict(False, "multi_turn:force_terminated",
                                       reason or f"{self.turns_checked} of {len(self.ground_truth)} user turns ran")
            else:
                self.verdict = Verdict(True)
        return self.verdict
