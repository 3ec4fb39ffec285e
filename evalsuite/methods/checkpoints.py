"""Method checkpoints, shared by every learned method (dlite, dflash, dspark, eagle3, and any new one).

Stable API (other method modules import these names; keep their signatures):

- `drafter_source(method, options, target=None) -> str | None`
      what to load: `options["drafter"]` (`--drafter`), else the shipped default for the target (`shipped_default`:
      `baselines/drafters/<method>/` for the default target, `baselines/drafters/<target key>/<method>/` for the
      other embedded targets, chosen by the target weights hash the drafter records); None only for
      `--drafter METHOD=random` (the caller then builds a random-init drafter). No --drafter and no shipped
      default is a one-line `UserError`, never a silent random init.
- `resolve_checkpoint_dir(source) -> Path`
      a local directory as is; anything else is an HF hub id fetched with `huggingface_hub.snapshot_download`
      (cache first, then the network); failure is a one-line `UserError`.
- `read_config(directory) -> dict`                the parsed config.json.
- `detect_method(config) -> str`                  the learned method whose module `recognises(config)`.
- `load_state_dict(directory, device, dtype)`     every tensor of the checkpoint's *.safetensors files (never
      pickle); `dtype` converts floating tensors only.
- `checkpoint_sha256(directory) -> str`           sha256 over the safetensors files, the string run.json records.
- `load_checkpoint(source, method) -> Checkpoint` all of the above in one call, with the method checked.
- `check_fit(target, who, ...)`                   drafter/target compatibility → one-line `UserError` (shapes,
      layers, mask token, and with `trained_for` the target weights hash the drafter was trained against).
- `trained_for(directory) -> TrainedFor | None`   that hash (and target name), from training_report.json or
      config.json; None for drafters that do not record it (released checkpoints from elsewhere).
- `load_weights(module, state, who, optional=())` strict key/shape match into an nn.Module → one-line `UserError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from evalsuite.bundled import bundled_path, packaged
from evalsuite.errors import UserError
from evalsuite.target import embedded
from evalsuite.target.model import cached_weights_hash, weights_hash

# Trained default drafters shipped with the repository (and packed into wheels), one directory per method.
DEFAULT_DRAFTER_ROOT = bundled_path("baselines/drafters")

_CONFIG = "config.json"
_INDEX = "model.safetensors.index.json"
_REPORT = "training_report.json"  # written by `evalsuite train` beside the checkpoint


@dataclass(frozen=True)
class TrainedFor:
    """The target a drafter was trained against, as its training report (or config.json) records it."""

    sha256: str  # the target's weights hash (`evalsuite.target.model.weights_hash`), as run.json records target_sha256
    name: str = ""


@dataclass(frozen=True)
class Checkpoint:
    source: str  # what the user passed (path or hub id) or the default directory
    path: Path  # local directory holding config.json and *.safetensors
    config: dict
    method: str
    sha256: str
    trained_for: TrainedFor | None = None

    def state_dict(self, device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> dict:
        return load_state_dict(self.path, device, dtype)


RANDOM_INIT = "random"  # `--drafter METHOD=random`: an untrained drafter of the default size (cost studies)


def drafter_source(method: str, options: dict, target=None) -> str | None:
    """Checkpoint dir / HF id to load, or None for a random-init drafter (`--drafter METHOD=random` only):
    `--drafter` wins, then the shipped default for `target` (`shipped_default`)."""
    if options.get("drafter") == RANDOM_INIT:
        return None
    if options.get("drafter"):
        return str(options["drafter"])
    default = shipped_default(method, target)
    if (default / _CONFIG).exists():
        return str(default)
    shown = f"baselines/drafters/{default.relative_to(DEFAULT_DRAFTER_ROOT).as_posix()}/"
    if not DEFAULT_DRAFTER_ROOT.is_dir():
        where = "this install has no baselines/drafters/ (installed without its bundled data)"
    elif packaged() and default.parent != DEFAULT_DRAFTER_ROOT:
        where = (f"wheels carry only the default target's drafters ({shown} ships in the repository: run from "
                 f"a checkout)")
    else:
        where = f"no shipped default in {shown}"
    raise UserError(f"method {method}: no --drafter given and {where}; pass --drafter {method}=DIR "
                    f"(or {method}=random for an untrained drafter)")


def shipped_default(method: str, target=None) -> Path:
    """The shipped drafter of `method` for `target`: among `baselines/drafters/<method>/` and
    `baselines/drafters/<sub>/<method>/`, the one whose recorded target weights hash is the target's; else the
    directory registered for the embedded target of that name (evalsuite/target/embedded.py), else
    `baselines/drafters/<method>/` (which `check_fit` then refuses if it was made for another target). Without a
    target: `baselines/drafters/<method>/`."""
    root = DEFAULT_DRAFTER_ROOT
    if target is None:
        return root / method
    own = target_weights_sha256(target)
    if own is not None and root.is_dir():
        candidates = [root / method] + [sub / method for sub in sorted(root.iterdir()) if sub.is_dir()]
        for candidate in candidates:
            found = trained_for(candidate) if (candidate / _CONFIG).exists() else None
            if found is not None and found.sha256 == own:
                return candidate
    entry = embedded.by_name(getattr(target, "name", ""))
    return root / entry.drafters / method if entry is not None and entry.drafters else root / method


def target_weights_sha256(target) -> str | None:
    """The target's weights hash (cached under evalsuite's cache dir), or None for a target without a model
    directory (test stand-ins)."""
    model_dir = getattr(target, "model_dir", None)
    return cached_weights_hash(str(model_dir)) if model_dir else None


def trained_for(directory: Path | str) -> TrainedFor | None:
    """The target a drafter was trained for: `target_sha256` (and `target`) from its training_report.json, else
    from its config.json; None when neither records it."""
    for name in (_REPORT, _CONFIG):
        try:
            record = json.loads((Path(directory) / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("target_sha256"), str) and record["target_sha256"]:
            return TrainedFor(record["target_sha256"], str(record.get("target") or ""))
    return None


def _looks_like_path(source: str) -> bool:
    return source.startswith((".", "/", "~")) or source.count("/") != 1


def resolve_checkpoint_dir(source: str) -> Path:
    path = Path(source).expanduser()
    if path.exists():
        if not (path / _CONFIG).exists():
            raise UserError(f"--drafter {source}: no config.json there; point it at a drafter checkpoint directory")
        return path
    if _looks_like_path(source):
        raise UserError(f"--drafter {source}: no such directory")
    from huggingface_hub import snapshot_download

    wanted = ["*.json", "*.safetensors"]
    try:
        return Path(snapshot_download(source, allow_patterns=wanted, local_files_only=True))
    except Exception:  # not in the local hub cache: try the network below
        pass
    try:
        return Path(snapshot_download(source, allow_patterns=wanted, etag_timeout=5))
    except Exception as err:
        raise UserError(
            f"--drafter {source}: cannot download from the Hugging Face hub ({type(err).__name__}: offline or "
            "unknown id); download it elsewhere and pass the local directory"
        ) from None


def read_config(directory: Path | str) -> dict:
    path = Path(directory) / _CONFIG
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"drafter config {path} is unreadable ({type(err).__name__}); re-download the checkpoint")
    if not isinstance(config, dict):
        raise UserError(f"drafter config {path} is not a JSON object; re-download the checkpoint")
    return config


def detect_method(config: dict) -> str:
    """Which learned method a released checkpoint belongs to: the one whose module's `recognises(config)` claims it
    (each learned method's module defines it: its released formats, docs/methods.md). None or several is a one-line
    error."""
    from evalsuite.catalog import METHODS

    found = [name for name, spec in METHODS.items() if spec.needs_checkpoint and spec.recognises(config)]
    if len(found) == 1:
        return found[0]
    architectures = [str(a) for a in config.get("architectures") or []]
    if found:
        raise UserError(f"drafter config: architectures={architectures} is claimed by {', '.join(found)}; pass "
                        "--method explicitly")
    raise UserError(f"drafter config: cannot tell the method from architectures={architectures}; pass --method "
                    "explicitly with a checkpoint of that method")


def _safetensors_files(directory: Path) -> list[Path]:
    index = directory / _INDEX
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise UserError(f"drafter {index} is unreadable ({type(err).__name__}); re-download the checkpoint") \
                from None
        missing = [n for n in names if not (directory / n).is_file()]
        if missing:
            raise UserError(f"drafter {directory}: {_few(missing)} listed in {_INDEX} missing; re-download it")
        return [directory / n for n in names]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        pickled = [p.name for p in directory.glob("*.bin")] + [p.name for p in directory.glob("*.pt")]
        hint = f" (found {', '.join(pickled)}: pickled weights are never loaded; convert them to safetensors)" \
            if pickled else ""
        raise UserError(f"drafter {directory}: no *.safetensors weights{hint}")
    return files


def load_state_dict(directory: Path | str, device: torch.device | str = "cpu",
                    dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in _safetensors_files(Path(directory)):
        try:
            tensors = load_file(str(file), device=str(device))
        except (SafetensorError, OSError) as err:
            raise UserError(f"drafter {file}: not a readable safetensors file ({err}); re-download the checkpoint") \
                from None
        for key, tensor in tensors.items():
            if dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)
            state[key] = tensor
    return state


def checkpoint_sha256(directory: Path | str) -> str:
    return weights_hash(str(directory))


def load_checkpoint(source: str, method: str | None = None) -> Checkpoint:
    """Resolve, read and identify a checkpoint; with `method`, refuse one that belongs to another method."""
    path = resolve_checkpoint_dir(source)
    config = read_config(path)
    found = detect_method(config)
    if method is not None and found != method:
        raise UserError(f"--drafter {source} is a {found} checkpoint, not {method}; run it with --method {found}")
    _safetensors_files(path)  # fail on missing weights before anything else is built
    return Checkpoint(source=source, path=path, config=config, method=found, sha256=checkpoint_sha256(path),
                      trained_for=trained_for(path))


def check_fit(target, who: str, *, hidden_size: int | None = None, vocab_size: int | None = None,
              layer_ids: tuple[int, ...] | list[int] = (), num_target_layers: int | None = None,
              mask_token_id: int | None = None, allow_embedding_layer: bool = False,
              trained_for: TrainedFor | None = None) -> None:
    """Refuse a drafter that does not fit the target, with one line that names the mismatch.

    `layer_ids` use the HF convention (j → hidden_states[j+1]); -1 (the embedding output) only when
    `allow_embedding_layer`. `num_target_layers` is the depth the drafter was trained against. `trained_for`
    (`Checkpoint.trained_for`): the target weights hash the drafter was trained against; a drafter made for
    another target is refused even when its shapes fit (checked last, so a shape mismatch is named first).
    """
    fix = "use a drafter trained for this target"
    if hidden_size is not None and int(hidden_size) != target.hidden_size:
        raise UserError(f"{who}: drafter hidden size {hidden_size} != target hidden size {target.hidden_size}; {fix}")
    if vocab_size is not None and int(vocab_size) != target.vocab_size:
        raise UserError(f"{who}: drafter vocabulary {vocab_size} != target vocabulary {target.vocab_size}; {fix}")
    if num_target_layers is not None and int(num_target_layers) != target.num_layers:
        raise UserError(f"{who}: drafter was built for a {num_target_layers}-layer target, this target has "
                        f"{target.num_layers} layers; {fix}")
    lowest = -1 if allow_embedding_layer else 0
    bad = [j for j in layer_ids if not lowest <= int(j) < target.num_layers]
    if bad:
        raise UserError(f"{who}: drafter reads target layers {bad}, the target has layers 0..{target.num_layers - 1}; "
                        f"{fix}")
    if mask_token_id is not None:
        rows = target.embed_tokens.weight.shape[0]
        if not 0 <= int(mask_token_id) < rows:
            raise UserError(f"{who}: mask token id {mask_token_id} is outside the target embedding table "
                            f"({rows} rows); {fix}")
    if trained_for is not None:
        own = target_weights_sha256(target)
        if own is not None and own != trained_for.sha256:
            made_for = f"{trained_for.name}, " if trained_for.name else ""
            raise UserError(f"{who}: drafter was trained for another target ({made_for}weights sha256 "
                            f"{trained_for.sha256[:12]}…), this target's is {own[:12]}…; {fix}")


def load_weights(module: torch.nn.Module, state: dict[str, torch.Tensor], who: str,
                 optional: tuple[str, ...] = ()) -> list[str]:
    """Copy `state` into `module`: every module key must be present (except keys starting with a prefix in
    `optional`, returned as the list of missing optional keys), no extra keys, identical shapes."""
    own = module.state_dict()
    missing = [k for k in own if k not in state]
    missing_required = [k for k in missing if not k.startswith(optional)]
    unexpected = [k for k in state if k not in own]
    if missing_required or unexpected:
        parts = []
        if missing_required:
            parts.append(f"missing {_few(missing_required)}")
        if unexpected:
            parts.append(f"unexpected {_few(unexpected)}")
        raise UserError(f"{who}: checkpoint keys do not match the {who} layout ({'; '.join(parts)}); "
                        "is it a checkpoint of this method?")
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}" for k, v in own.items()
              if k in state and tuple(state[k].shape) != tuple(v.shape)]
    if shapes:
        raise UserError(f"{who}: checkpoint shapes disagree with its config.json ({_few(shapes)}); re-download it")
    with torch.no_grad():
        for key, value in own.items():
            if key in state:
                value.copy_(state[key].to(value.dtype))
    return missing


def _few(items: list[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (f" (+{len(items) - n} more)" if len(items) > n else "")
