"""What methods and engines exist, what each can do and which settings each takes, without importing any of them
(no torch): the CLI and `RunConfig.validate` check names, capabilities and `--method-option` values here in
milliseconds; a method's or an engine's module is imported only when it is built.

A plug-in declares itself in its own file, as one module-level statement `SPEC = MethodSpec(...)` (a module of
`evalsuite/methods/`) or `SPEC = EngineSpec(...)` (a module of `evalsuite/engines/`). The catalog finds every
such module with `pkgutil` and reads that one statement from its source (`declared`): it is evaluated alone, with
the names of this module, so it may use literals, lambdas and what this module defines (`Option`, `SEED`,
`positive`, ...), nothing of its own file. No central list names the plug-ins; a module without `SPEC` (a shared
helper such as `methods/draft_layers.py`) is not one.

A method *label* `NAME:KEY=VALUE[:KEY=VALUE…]` (e.g. `eagle3:window=2048`) names a variant: method NAME with
those settings, run and recorded under the label, so that one run can hold a method and its variants side by
side (`--method eagle3,eagle3:window=2048`). A variant takes its base's `--drafter` and `--method-option`
settings unless given its own (`RunConfig.validate`); `method_spec` resolves a label and every consumer asks it.

Capabilities are declared once, on the method's spec: `needs_checkpoint` (a learned drafter, trained by the
recipe of the same name in `evalsuite/train/recipes/`), `windowable` (a draft KV cache over the context, so it
takes `window`: docs/methods.md §7), `learns_across_turns`, `repeatable`, `batched` (`evalsuite profile` runs its
own modules over a batch axis), and `engines` / `not_in` (how an engine with its own speculative decoding, vLLM,
names it, or why it cannot run it). An engine declares what it supports on its `EngineSpec`; `engine_refusal`
is the one message for a method an engine cannot run.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib
import pkgutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from evalsuite.conventions import BASELINE
from evalsuite.errors import UserError

PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Option:
    """One `--method-option METHOD.KEY=VALUE` setting: its type, a check, and what it does."""

    kind: type  # int | float | str
    help: str
    check: Callable[[object], bool] = lambda value: True
    rule: str = ""  # what `check` requires, for the error message
    default: object = None  # the method's own default (what an engine that takes the setting by name is given)

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
class Speculative:
    """How an engine that brings its own speculative decoding (vLLM) runs a method (`MethodSpec.engines`)."""

    method: str | None  # the engine's own name for the method (None: its plain decoding, the `ar` baseline)
    options: dict[str, str] = field(default_factory=dict)  # our --method-option key → the engine's argument
    drafter: bool = False  # the engine loads the method's drafter checkpoint (--drafter)
    needs: str = ""  # what else it needs there, for messages ("arctic-inference in vLLM's venv")


@dataclass(frozen=True)
class MethodSpec:
    name: str
    summary: str
    needs_checkpoint: bool = False  # a learned method: loads a drafter (`--drafter`) or the shipped default, and
    # `evalsuite train` trains it with the recipe of the same name (evalsuite/train/recipes/)
    options: dict[str, Option] = field(default_factory=dict)
    learns_across_turns: bool = False  # keeps what earlier replies taught it (across turns, in one process)
    repeatable: bool = True  # a turn decoded again does the same work (a learning method can forget the turn)
    windowable: bool = False  # keeps a draft KV cache over the context: takes `window` (docs/methods.md §7)
    batched: bool = False  # `evalsuite profile` at batch > 1 runs its own modules over a batch axis (a counterpart
    # registered with `evalsuite.profile.batched.batches`); False: B sequential copies (host-side work per request)
    engines: dict[str, Speculative] = field(default_factory=dict)  # engine → how it names and runs this method
    # (only engines with `EngineSpec.own_methods` read it; every other engine runs every method)
    not_in: dict[str, str] = field(default_factory=dict)  # engine → why it cannot run this method
    module: str = ""  # evalsuite.methods.<module> defines `build(target, options) -> Method` (set by `declared`)
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

    def recognises(self, config: dict) -> bool:
        """Whether a drafter's config.json is in this learned method's released format: its module's
        `recognises(config)` (imported now; `methods.checkpoints.detect_method` asks every learned method)."""
        hook = getattr(importlib.import_module(f"evalsuite.methods.{self.module}"), "recognises", None)
        if hook is None:
            raise TypeError(f"evalsuite/methods/{self.module}.py: a learned method defines recognises(config) -> bool")
        return bool(hook(config))

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


@dataclass(frozen=True)
class EngineSpec:
    """What decodes a turn (`--engine NAME`): its module defines `build(config, run_dir) -> Engine`."""

    name: str
    summary: str
    title: str = ""  # its name in sentences ("vLLM"; "" = the name)
    own_methods: bool = False  # brings its own speculative decoding: runs only the methods that say how it names
    # them (`MethodSpec.engines`); otherwise it runs every method through `evalsuite.methods`
    variants: bool = True  # runs method labels and draft windows (evalsuite's own, docs/methods.md §7)
    repeats: bool = True  # decodes a turn more than once (--repeats > 1)
    scale_out: bool = True  # runs on Ray workers (--workers, --ray-address)
    cpu_dtypes: tuple[str, ...] = ()  # the only dtypes it takes on CPU (empty: any)
    module: str = ""  # evalsuite.engines.<module> (set by `declared`)

    @property
    def shown(self) -> str:
        return self.title or self.name

    @property
    def factory(self):
        """The engine module's `build(config, run_dir)`; importing it (and, for ours, torch) only now."""
        return importlib.import_module(f"evalsuite.engines.{self.module}").build


SEED = Option(int, "seed of a random-init drafter (--drafter METHOD=random)")
WINDOW_KEY = "window"
WINDOW = Option(int, "attend only to the last W positions of the draft KV cache, which then keeps at most W + 64 "
                "(docs/methods.md §7; default: the whole context)", lambda v: v >= 1,
                "must be >= 1 (positions of the draft KV cache)")


def positive(value) -> bool:
    return value >= 1


SPEC_NAME = "SPEC"


def declared(package: str, kind: type) -> dict:
    """The `SPEC = kind(...)` of every module of `evalsuite/<package>/`, by name, read from the source without
    importing the module (so without torch). A module without one is not a plug-in; two with one name, or a
    declaration that uses a name of its own file, is an error naming the file."""
    found: dict = {}
    folder = PACKAGE_DIR / package
    for info in pkgutil.iter_modules([str(folder)]):
        path = folder / f"{info.name}.py"
        if info.ispkg or not path.is_file():
            continue
        spec = _read_spec(path)
        if spec is None:
            continue
        if not isinstance(spec, kind):
            raise TypeError(f"{path}: {SPEC_NAME} is a {type(spec).__name__}, not a {kind.__name__}")
        if spec.name in found:
            raise ValueError(f"{path}: {kind.__name__} '{spec.name}' is already declared by "
                             f"evalsuite/{package}/{found[spec.name].module}.py")
        found[spec.name] = replace(spec, module=info.name)
    return found


def _read_spec(path: Path):
    source = path.read_text(encoding="utf-8")
    if SPEC_NAME not in source:
        return None
    for node in ast.parse(source, str(path)).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == SPEC_NAME for t in node.targets):
            code = compile(ast.Expression(node.value), str(path), "eval")
            try:
                return eval(code, dict(globals()))  # noqa: S307 (our own package's source)
            except NameError as err:
                raise NameError(f"{path}: {SPEC_NAME} may use literals and the names of evalsuite.catalog only "
                                f"({err})") from None
    return None


def _ordered(specs: dict) -> dict:
    """The baseline first, then the model-free methods, then the learned ones, each by name."""
    return dict(sorted(specs.items(), key=lambda item: (item[0] != BASELINE, item[1].needs_checkpoint, item[0])))


METHODS: dict[str, MethodSpec] = _ordered(declared("methods", MethodSpec))
ENGINES: dict[str, EngineSpec] = dict(sorted(declared("engines", EngineSpec).items()))


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


def engine_spec(name: str) -> EngineSpec:
    """The spec of `--engine NAME`; an unknown name is a one-line error."""
    if name not in ENGINES:
        raise UserError(f"--engine {name}: choose from {', '.join(ENGINES)}{suggest(name, ENGINES)}")
    return ENGINES[name]


def engine_refusal(engine: EngineSpec, spec: MethodSpec, options: dict | None = None) -> str:
    """Why `engine` cannot run the method (or label) of `spec` with these settings, or "": the one message for every
    consumer (RunConfig.validate, the engine itself)."""
    if engine.own_methods and engine.name not in spec.engines:
        why = spec.not_in.get(engine.name, f"not available in {engine.shown}")
        runs = [name for name, other in METHODS.items() if engine.name in other.engines]
        needs = "; ".join(f"{name} needs {METHODS[name].engines[engine.name].needs}" for name in runs
                          if METHODS[name].engines[engine.name].needs)
        return (f"--engine {engine.name}: method '{spec.name}' is not available ({why}); {engine.shown} runs "
                f"{', '.join(runs)}" + (f" ({needs})" if needs else ""))
    if not engine.variants and (spec.base or WINDOW_KEY in (options or {})):
        others = ", ".join(name for name, other in ENGINES.items() if other.variants)
        return (f"--engine {engine.name}: method '{spec.name}' with a label or a window: the draft window and "
                f"method labels are evalsuite's own (docs/methods.md §7); use --engine {others}")
    return ""


def windowable() -> list[str]:
    return sorted(name for name, spec in METHODS.items() if spec.windowable)


def suggest(name: str, choices) -> str:
    """' (did you mean X?)' for the closest choice, or ''."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""
