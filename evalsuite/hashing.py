"""sha256 of files and texts: what run.json records to tell data, weights and templates apart."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def text_hash(text: str | None) -> str:
    """The first 16 hex digits of the sha256 of a text (a chat template, a vocabulary)."""
    return hashlib.sha256((text or "").encode()).hexdigest()[:16]
