"""Tokenizers: text to token ids and back, behind one small interface.

``ByteTokenizer`` serves random-weight shapes and CPU tests: ids 0..255 are the UTF-8 bytes,
``bos_id``/``eos_id`` are special ids above 255, and every other id (a random model can emit any
id below its vocab size) decodes to nothing. ``HFTokenizer`` wraps a ``tokenizer.json`` through the
``tokenizers`` library.

This module knows nothing about models, devices or tensors: ids are plain ``list[int]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from tokenizers import Tokenizer as _HFTokenizerImpl

__all__ = ["BYTE_TOKENIZER_FILE", "ByteTokenizer", "HFTokenizer", "Tokenizer", "load_tokenizer"]

# The file a checkpoint directory carries when its tokenizer is the byte tokenizer.
BYTE_TOKENIZER_FILE = "polymorph_tokenizer.json"


class Tokenizer(Protocol):
    """What the engine needs from a tokenizer."""

    eos_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def save(self, directory: Path) -> None:
        """Write this tokenizer's files into a checkpoint ``directory``."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255; ``bos_id`` and ``eos_id`` are special ids in [256, vocab_size)."""

    def __init__(self, vocab_size: int = 512, bos_id: int = 256, eos_id: int = 257) -> None:
        if vocab_size < 258:
            raise ValueError(f"a byte tokenizer needs vocab_size >= 258, got {vocab_size}")
        for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
            if not 256 <= value < vocab_size:
                raise ValueError(f"byte tokenizer {name} must be in [256, {vocab_size}), got {value}")
        self.vocab_size = vocab_size
        self.bos_id = bos_id
        self.eos_id = eos_id

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        # Ids that are not bytes (specials, or anything a random model emits) decode to nothing.
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def save(self, directory: Path) -> None:
        doc = {"type": "byte", "vocab_size": self.vocab_size, "bos_id": self.bos_id, "eos_id": self.eos_id}
        (Path(directory) / BYTE_TOKENIZER_FILE).write_text(json.dumps(doc, indent=2) + "\n")

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, eos_id={self.eos_id})"


class HFTokenizer:
    """A ``tokenizer.json`` loaded through ``tokenizers``; ``eos_id`` comes from the model config."""

    def __init__(self, impl: _HFTokenizerImpl, eos_id: int) -> None:
        self._impl = impl
        self.eos_id = eos_id
        self.vocab_size = impl.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_file(cls, path: Path, eos_id: int) -> HFTokenizer:
        return cls(_HFTokenizerImpl.from_file(str(path)), eos_id)

    def encode(self, text: str) -> list[int]:
        # add_special_tokens follows the tokenizer's own post-processor (e.g. Llama 3 prepends BOS).
        return list(self._impl.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._impl.decode(ids, skip_special_tokens=True))

    def save(self, directory: Path) -> None:
        self._impl.save(str(Path(directory) / "tokenizer.json"))

    def __repr__(self) -> str:
        return f"HFTokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id})"


def load_tokenizer(directory: Path, eos_id: int) -> Tokenizer | None:
    """The tokenizer a checkpoint ``directory`` carries, or None when it carries none."""
    directory = Path(directory)
    if (directory / "tokenizer.json").is_file():
        return HFTokenizer.from_file(directory / "tokenizer.json", eos_id)
    byte_file = directory / BYTE_TOKENIZER_FILE
    if byte_file.is_file():
        doc = json.loads(byte_file.read_text())
        return ByteTokenizer(int(doc["vocab_size"]), int(doc["bos_id"]), int(doc["eos_id"]))
    return None
