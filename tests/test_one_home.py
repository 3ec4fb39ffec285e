"""One home per fact: τ, break-even τ and the pairing with `ar` are defined in evalsuite/metrics.py, the clock in
evalsuite/timing.py, the baseline's name in evalsuite/conventions.py, and every other module calls them.

The test reads the package's code (comments and strings left out, so a docstring may say "accepted + 1") and
fails on a fact written out again, naming file:line. Each rule lists the spellings the package has used; the
planted-copy tests check that the rules catch them.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "evalsuite"

# a name with attribute reads and calls after it: num_accepted, steps.num_accepted.to_numpy(float), hits[starts]
_OPERAND = r"[\w.]*(?:\([^()]*\)|\[[^\[\]]*\]|\.\w+)*"
_ONE = r"1(?:\.0*)?(?![\w.])"
_BASELINE = r"BASELINE"  # the literal "ar" has a rule of its own (strings are blanked before the rules read code)


@dataclass
class Rule:
    fact: str
    home: str  # the module that holds it, relative to the package
    patterns: list[str]
    allowed: dict[str, str] = field(default_factory=dict)  # module → why the spelling is not this fact there

    def matches(self, code: str) -> bool:
        return any(re.search(p, code) for p in self.patterns)


RULES = [
    Rule("τ: tokens per verify step = accepted + 1 (metrics.step_tokens, metrics.tau, metrics.tau_of)", "metrics.py",
         [rf"accepted{_OPERAND}\s*\+\s*(?:{_ONE}|steps\b|n_steps\b|len\()",  # (num_accepted + 1).mean(), accepted + steps
          rf"(?<![\w.]){_ONE}\s*\+\s*{_OPERAND}accepted",  # 1 + accepted
          rf"\.mean\(\)\s*\+\s*{_ONE}"],  # hits.mean() + 1.0
         allowed={"engines/loop.py": "the decode loop keeps the accepted drafts and the bonus in the KV cache and the "
                                     "drafter's features: positions, not τ"}),
    Rule("break-even τ* = (draft + verify) / decode (metrics.tau_break_even)", "metrics.py",
         [r"\(\s*[\w.\[\]]*(?:draft|verify)[\w.\[\]]*\s*\+\s*[\w.\[\]]*(?:draft|verify)[\w.\[\]]*\s*\)\s*/",
          r"\bstep\w*\s*/\s*[\w.]*ar_step"]),
    Rule("pairing: `ar` is decoded beside every other method (metrics.with_baseline)", "metrics.py",
         [rf"\.(?:add|append)\(\s*{_BASELINE}\s*\)", rf"\|\s*\{{\s*{_BASELINE}\s*\}}",
          rf"-\s*\{{\s*{_BASELINE}\s*\}}\s*(?:and|or|:)"]),  # `if wanted - {BASELINE} and …`: the old test for it
    Rule("the clock: target and drafter timings (timing.DeviceClock, timing.wall)", "timing.py",
         [r"\bperf_counter\b", r"\btime\.time(?:_ns)?\(", r"\bmonotonic\(", r"cuda\.Event\(", r"\.elapsed_time\("],
         allowed={"engines/vllm_worker.py": "runs in vLLM's own interpreter, which has none of the harness",
                  "engines/vllm_engine.py": "a deadline for the worker's reply, not a timing",
                  "contention.py": "the machine's load over a decode's wall interval; below timing.py's torch",
                  "train/loop.py": "training's elapsed time, not a decode's cost",
                  "train/pipeline.py": "training's stage times and throughput, not a decode's cost"}),
]

BASELINE_NAME_ALLOWED = {
    "conventions.py": "its home",
    "catalog.py": "the method registry declares the method itself",
    "methods/ar.py": "the method's own name",
    "engines/vllm_engine.py": "the methods vLLM runs, by name",
    "engines/vllm_worker.py": "runs in vLLM's own interpreter, which has none of the harness",
}


TEXT = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}  # an f-string's text (3.12+)


def statements(source: str) -> list[dict[int, str]]:
    """Each logical line of code as {line number: that line's code}, comments dropped and every string literal
    replaced by ''."""
    found, current = [], {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.NEWLINE:
            found.append({number: " ".join(parts) for number, parts in current.items()})
            current = {}
        elif token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT,
                                tokenize.ENDMARKER):
            current.setdefault(token.start[0], []).append("''" if token.type in TEXT else token.string)
    return found


def _tidy(code: str) -> str:
    """Undo the token spacing around brackets and dots, so patterns read the code as it is usually written."""
    code = re.sub(r"\s*([.\[\](),])\s*", r"\1", code)
    return re.sub(r",", ", ", code)


def baseline_literals(source: str) -> list[int]:
    """Lines where the string "ar" is written out."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.STRING:
            try:
                value = ast.literal_eval(token.string)
            except (ValueError, SyntaxError):
                continue
            if value == "ar":
                found.append(token.start[0])
    return found


def violations(package: Path) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        source = path.read_text()
        written = source.splitlines()
        for statement in statements(source):
            whole = _tidy(" ".join(statement.values()))
            for rule in RULES:
                if module == rule.home or module in rule.allowed or not rule.matches(whole):
                    continue
                # the line that holds it, else (a formula broken over lines) the statement's first line
                lines = [n for n, code in statement.items() if rule.matches(_tidy(code))] or [min(statement)]
                found += [f"evalsuite/{module}:{n}: {rule.fact}, written again (its home: evalsuite/{rule.home}): "
                          f"{written[n - 1].strip()}" for n in lines]
        if module not in BASELINE_NAME_ALLOWED:
            found += [f"evalsuite/{module}:{number}: the baseline's name written out as \"ar\" (its home: "
                      "evalsuite/conventions.py BASELINE)" for number in baseline_literals(source)]
    return found


def test_every_fact_has_one_home():
    found = violations(PACKAGE)
    assert not found, "\n".join(found)


PLANTED = [  # the copies the package held before they moved to their homes
    "tau = float((mine.num_accepted + 1).mean())",
    "grouped = (cell.num_accepted + 1).astype(float).groupby(units).agg(['sum', 'count'])",
    "return float((own.num_accepted + 1).sum() / len(own)) if len(own) else float('nan')",
    "tokens = steps.num_accepted.to_numpy(float) + 1",
    "tau = (accepted + steps) / steps if steps else float('nan')",
    "return float(hits[starts].mean() + 1.0)",
    "star, star_step = (draft + verify) / ar_decode, step / ar_step",
    "value = (verify + draft) / decode if decode else np.nan",
    "return (draft_ms + verify_ms) / decode_ms",
    "return (t_verify + t_draft) / t_decode",
    "start = time.perf_counter()",
    "self.started = time.monotonic()",
    "start = torch.cuda.Event(enable_timing=True)",
    "todo.add(BASELINE)",
    "keep = set(methods) | {BASELINE}",
    "decode = set(wanted) | ({BASELINE} if set(wanted) - {BASELINE} and ar_has_turn else set())",
    "ar = warmup_costs.get('ar')",
]


def plant(tmp_path: Path, line: str, module: str = "report/planted.py") -> Path:
    """A package of one module holding `line` in a function (its last line): the rules read files one by one."""
    package = tmp_path / "evalsuite"
    target = package / module
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("def planted(mine, cell, own, steps, hits, starts, units, accepted, draft, verify, decode, "
                      "ar_decode, step, ar_step, sums, methods, todo, wanted, ar_has_turn, warmup_costs):\n"
                      f"    {line}\n")
    return package


@pytest.mark.parametrize("line", PLANTED)
def test_a_planted_copy_is_named_with_its_file_and_line(tmp_path, line):
    copy = plant(tmp_path, line)
    found = violations(copy)
    assert found, f"not caught: {line}"
    assert all(hit.startswith("evalsuite/report/planted.py:") for hit in found), found
    number = len((copy / "report/planted.py").read_text().splitlines())
    assert any(hit.startswith(f"evalsuite/report/planted.py:{number}:") for hit in found), found


def test_words_in_comments_and_docstrings_are_not_code(tmp_path):
    copy = plant(tmp_path, '"""τ = Σ (accepted + 1) / steps; τ* = (draft + verify) / decode; ar"""  # accepted + 1')
    assert violations(copy) == []


def test_a_formula_broken_over_lines_is_caught(tmp_path):
    copy = plant(tmp_path, "star = (draft +\n            verify) / decode")
    number = len((copy / "report/planted.py").read_text().splitlines()) - 1
    assert [hit.split(": ")[0] for hit in violations(copy)] == [f"evalsuite/report/planted.py:{number}"]


def test_a_home_may_hold_its_own_fact(tmp_path):
    copy = plant(tmp_path, "return (num_accepted + 1).mean()", module="metrics.py")
    assert violations(copy) == []
