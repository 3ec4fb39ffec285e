"""What methods exist and which settings each takes, without importing any of them (no torch): the CLI and
`RunConfig.validate` check names and `--method-option` values here in milliseconds; `evalsuite.methods.base.
get_method` imports a method's module only when it is built.

A method *label* `NAME:KEY=VALUE[:KEY=VALUE…]` (e.g. `eagle3:window=2048`) names a variant: method NAME with
those settings, run and recorded under the label, so that one run can hold a method and its variants side by
side (`--method eagle3,eagle3:window=2048`). A variant takes its base's `--drafter` and `--method-option`
settings unless given its own (`RunConfig.validate`); `method_spec` resolves a label and every consumer asks it.

Capabilities are declared here once, per method: `needs_checkpoint` (a learned drafter), `windowable` (a draft
KV cache over the context, so it takes `window`: docs/methods.md §7), `learns_across_turns`, `repeatable`,
`not_in_vllm`.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from dataclasses import dataclass, field, replace
from typing import Callable

from evalsuite.errors import UserError


@dataclass(frozen=True)
class Option:
    """One `--method-option METHOD.KEY=VALUE` setting: its type, a check, and what it does."""

    kind: type  # int | float | str
    help: str
    check: Callable[[object], bool] = lambda value: True
    rule: str = ""  # what `check` requires, for the error message

    def parse(self, method: str, key: str, raw, where: str = "") -> object:
        where = where or f"--method-option {method}.{key}={raw}"
        try:
            value = self.kind(raw)
        except (TypeError, ValueError):
            raise UserError(f"{where}: not a valid {self.kind.__name__}") from None
        if not self.check(value):
            raise UserError(f"{where}: {self.rule}")
        return value


@dataclass(frozen=True)
class MethodSpec:
    name: str
    module: str  # evalsuite.methods.<module> defines `build(target, options) -> Method`
    summary: str
    needs_checkpoint: bool = False  # a learned method: loads a drafter (`--drafter`) or the shipped default
    options: dict[str, Option] = field(default_factory=dict)
    learns_across_turns: bool = False  # keeps what earlier replies taught it (across turns, in one process)
    repeatable: bool = True  # a turn decoded again does the same work (a learning method can forget the turn)
    not_in_vllm: str = ""  # why `--engine vllm` cannot run it ("" = vLLM runs it)
    windowable: bool = False  # keeps a draft KV cache over the context: takes `window` (docs/methods.md §7)
    base: str = ""  # a variant (label NAME:KEY=VALUE): the method it runs ("" = this is a method, not a variant)
    presets: dict = field(default_factory=dict)  # a variant's settings from its label, parsed

    def __post_init__(self):
        if self.windowable and WINDOW_KEY not in self.options:
            object.__setattr__(self, "options", {**self.options, WINDOW_KEY: WINDOW})

    @property
    def method(self) -> str:
        """The method this name runs (a variant's base, else the name itself)."""
        return self.base or self.name

    @property
    def factory(self):
        """The method's `build(target, options)`; importing its module (and torch) only now."""
        return importlib.import_module(f"evalsuite.methods.{self.module}").build

    def parse_options(self, raw: dict, where: str = "") -> dict:
        """`--method-option` values for this method, converted and checked, with a variant's label settings; an
        unknown key, or one that contradicts the label, is a one-line error."""
        parsed = dict(self.presets)
        for key, value in raw.items():
            shown = where or f"--method-option {self.name}.{key}={value}"
            if key == WINDOW_KEY and not self.windowable:
                raise UserError(f"{shown}: {self.method} keeps no draft KV cache over the context, so it has no "
                                f"window; windowable: {', '.join(windowable())}")
            if key not in self.options:
                choices = ", ".join(sorted(self.options)) or "none"
                unknown = f"{where}: unknown setting {key}" if where else \
                    f"--method-option {self.name}.{key}: unknown setting"
                raise UserError(f"{unknown}{suggest(key, self.options)}; {self.method} takes: {choices}")
            value = self.options[key].parse(self.name, key, value, where)
            if key in self.presets and value != self.presets[key]:
                raise UserError(f"{shown}: the label {self.name} already sets {key}={self.presets[key]}")
            parsed[key] = value
        return parsed


SEED = Option(int, "seed of a random-init drafter (--drafter METHOD=random)")
WINDOW_KEY = "window"
WINDOW = Option(int, "attend only to the last W positions of the draft KV cache, which then keeps at most W + 64 "
                "(docs/methods.md §7; default: the whole context)", lambda v: v >= 1,
                "must be >= 1 (positions of the draft KV cache)")


def _positive(value) -> bool:
    return value >= 1


METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in [
    MethodSpec("ar", "ar", "no drafting: the target decodes one token per forward (the speedup baseline)"),
    MethodSpec("ngram", "ngram", "prompt lookup: proposes the continuation of the latest earlier match of the last n "
               "tokens", options={
                   "max_ngram": Option(int, "longest n-gram looked up (3)", _positive, "must be >= 1"),
                   "min_ngram": Option(int, "shortest n-gram looked up (1)", _positive, "must be >= 1")}),
    MethodSpec("suffix", "suffix", "SuffixDecoding (arctic-inference): suffix trees over the context and over earlier "
               "replies", options={
                   "max_depth": Option(int, "tokens matched against the trees (64)", lambda v: v >= 2,
                                       "must be >= 2"),
                   "max_spec_factor": Option(float, "draft length per matched token (1.0)", lambda v: v >= 0,
                                             "must be >= 0"),
                   "max_spec_offset": Option(float, "draft length offset (0)"),
                   "min_token_prob": Option(float, "smallest estimated probability followed (0.1)",
                                            lambda v: 0 <= v <= 1, "must be in [0, 1]"),
                   "max_cached_requests": Option(int, "replies kept in the global tree (-1 = all)",
                                                 lambda v: v != 0, "0 would switch the global tree off; use -1 "
                                                 "for no limit")},
               learns_across_turns=True),  # and forgets a repeated turn's reply (rewind_turn)
    MethodSpec("dlite", "dlite", "DLite: history-free block drafter (last token's multi-layer features, RNN head, no "
               "KV cache)", True, {"anchor_group_size": Option(int, "random init: anchors per group G (1)", _positive,
                                                                "must be >= 1"), "seed": SEED},
               not_in_vllm="vLLM has no DLite drafter"),
    MethodSpec("eagle3", "eagle3", "EAGLE-3: one draft layer over fused target features, draft KV cache, chain "
               "drafting", True, {
                   "format": Option(str, "random init: deepspec | specforge layout", lambda v: v in
                                    ("deepspec", "specforge"), "choose deepspec or specforge"),
                   "draft_vocab_size": Option(int, "random init: reduced draft vocabulary size", _positive,
                                              "must be >= 1"),
                   "seed": SEED}, windowable=True),
    MethodSpec("dflash", "dflash", "DFlash: parallel block drafter over a draft KV cache (z-lab b16 or DeepSpec "
               "block7 layout)", True, {"layout": Option(str, "random init: zlab | block7", lambda v: v in
                                                         ("zlab", "block7"), "choose zlab or block7"),
                                        "seed": SEED},
               not_in_vllm="vLLM's dflash loads DFlashQwen3/Laguna drafters for Qwen3-family targets only, not our "
                           "DFlashDraftModel checkpoint for a Llama target", windowable=True),
    MethodSpec("dspark", "dspark", "DSpark (DeepSpec): DFlash backbone, every slot predicts, Markov head, confidence "
               "head", True, {"confidence_threshold": Option(float, "truncate the block at the first slot whose "
                                                              "confidence is below it (0 = off)",
                                                              lambda v: 0 <= v <= 1, "must be in [0, 1]"),
                              "seed": SEED},
               not_in_vllm="vLLM's dspark is DeepSeek-V4 only and its sparse attention does not run on CPU",
               windowable=True),
]}


VARIANT_SEPARATOR = ":"  # NAME:KEY=VALUE[:KEY=VALUE…]


def method_spec(name: str) -> MethodSpec:
    """The spec of a method, or of a variant label (`eagle3:window=2048`); an unknown name or a malformed label
    is a one-line error."""
    base, sep, _ = name.partition(VARIANT_SEPARATOR)
    if base not in METHODS:
        raise UserError(f"unknown method '{base}'{suggest(base, METHODS)}; choose from: {', '.join(sorted(METHODS))}"
                        + (f" (in the label {name})" if sep else ""))
    return _variant(name) if sep else METHODS[name]


@functools.lru_cache(maxsize=None)
def _variant(label: str) -> MethodSpec:
    base, _, rest = label.partition(VARIANT_SEPARATOR)
    spec = METHODS[base]
    raw: dict[str, str] = {}
    for item in rest.split(VARIANT_SEPARATOR):
        key, eq, value = item.partition("=")
        if not (key and eq and value):
            raise UserError(f"--method {label}: write METHOD{VARIANT_SEPARATOR}KEY=VALUE, e.g. eagle3:window=2048")
        if key in raw:
            raise UserError(f"--method {label}: {key} given twice")
        raw[key] = value
    presets = {key: spec.parse_options({key: value}, f"--method {label}")[key] for key, value in raw.items()}
    return replace(spec, name=label, base=base, presets=presets)


def windowable() -> list[str]:
    return sorted(name for name, spec in METHODS.items() if spec.windowable)


def suggest(name: str, choices) -> str:
    """' (did you mean X?)' for the closest choice, or ''."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""
