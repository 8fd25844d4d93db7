"""Tokenizers: text to token ids and back, behind one small interface.

``ByteTokenizer`` serves random-weight shapes and CPU tests: ids 0..255 are the UTF-8 bytes,
``bos_id``/``eos_id`` are special ids above 255, and every other id (a random model can emit any
id below its vocab size) decodes to nothing. ``HFTokenizer`` wraps a ``tokenizer.json`` through the
``tokenizers`` library.

Each tokenizer carries a ``ChatFormat``: the chat template a chat request is rendered with
(``polymorph_engine.serving.chat``), the special-token strings the template may print, and the
end-of-turn ids generation stops at. An HF checkpoint's comes from ``chat_template`` in
``tokenizer_config.json`` (a string, or a list of named templates: "default" is taken), else
from ``chat_template.jinja``, its end-of-turn ids from the tokenizer's ``eos_token``,
``generation_config.json``'s ``eos_token_id`` and the well-known end-of-turn tokens the
template prints; a checkpoint with neither file has none (chat requests are then a 400). The
byte tokenizer's is ``DEFAULT_CHAT_TEMPLATE``, a plain-text template (its end of turn is
``eos_id``).

This module knows nothing about models, devices or tensors: ids are plain ``list[int]``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tokenizers import Tokenizer as _HFTokenizerImpl

__all__ = [
    "BYTE_TOKENIZER_FILE",
    "DEFAULT_CHAT_TEMPLATE",
    "ByteTokenizer",
    "ChatFormat",
    "HFTokenizer",
    "Tokenizer",
    "load_chat_format",
    "load_tokenizer",
]

# The file a checkpoint directory carries when its tokenizer is the byte tokenizer.
BYTE_TOKENIZER_FILE = "polymorph_tokenizer.json"

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""The random-weight shapes' chat template (the byte tokenizer's): each turn is ``<|role|>``, a
newline, its text and a newline; the generation prompt is ``<|assistant|>`` and a newline. Plain
text, since the byte tokenizer has no special tokens that text can name; a turn ends at the
tokenizer's ``eos_id``."""

# End-of-turn tokens of common chat templates: generation stops at those the template prints.
_END_OF_TURN_TOKENS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<end_of_turn>",
    "<|end|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
    "<|eom_id|>",
)


@dataclass(frozen=True)
class ChatFormat:
    """How a chat is rendered into a prompt, and which ids end the assistant's turn."""

    template: str
    end_of_turn_ids: tuple[int, ...]
    special_tokens: tuple[tuple[str, str], ...] = ()
    """``bos_token``, ``eos_token``, ... as the template sees them (name, text)."""
    source: str = "default"


class Tokenizer(Protocol):
    """What the engine needs from a tokenizer."""

    eos_id: int
    vocab_size: int

    chat_format: ChatFormat | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def token_bytes(self, token: int) -> bytes:
        """The bytes one id stands for (b"" for a special id), for logprobs."""
        ...

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
        self.chat_format: ChatFormat | None = ChatFormat(DEFAULT_CHAT_TEMPLATE, (eos_id,))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def token_bytes(self, token: int) -> bytes:
        return bytes([token]) if 0 <= token < 256 else b""

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
        self.chat_format: ChatFormat | None = None

    @classmethod
    def from_file(cls, path: Path, eos_id: int) -> HFTokenizer:
        return cls(_HFTokenizerImpl.from_file(str(path)), eos_id)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # add_special_tokens follows the tokenizer's own post-processor (e.g. Llama 3 prepends BOS);
        # a rendered chat is encoded without it, as transformers does: the template prints its own.
        return list(self._impl.encode(text, add_special_tokens=add_special_tokens).ids)

    def token_bytes(self, token: int) -> bytes:
        return str(self._impl.decode([token], skip_special_tokens=True)).encode("utf-8")

    def token_id(self, text: str) -> int | None:
        found = self._impl.token_to_id(text)
        return None if found is None else int(found)

    def decode(self, ids: list[int]) -> str:
        return str(self._impl.decode(ids, skip_special_tokens=True))

    def save(self, directory: Path) -> None:
        self._impl.save(str(Path(directory) / "tokenizer.json"))
        if self.chat_format is not None:  # the template, and the special tokens it prints
            config = {name: text for name, text in self.chat_format.special_tokens}
            config["chat_template"] = self.chat_format.template
            (Path(directory) / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")

    def __repr__(self) -> str:
        return f"HFTokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id})"


def load_tokenizer(directory: Path, eos_id: int) -> Tokenizer | None:
    """The tokenizer a checkpoint ``directory`` carries, or None when it carries none."""
    directory = Path(directory)
    if (directory / "tokenizer.json").is_file():
        tokenizer = HFTokenizer.from_file(directory / "tokenizer.json", eos_id)
        tokenizer.chat_format = load_chat_format(directory, tokenizer)
        return tokenizer
    byte_file = directory / BYTE_TOKENIZER_FILE
    if byte_file.is_file():
        doc = json.loads(byte_file.read_text())
        return ByteTokenizer(int(doc["vocab_size"]), int(doc["bos_id"]), int(doc["eos_id"]))
    return None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}).") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path} must hold a JSON object.")
    return doc


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an object with "content"."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def load_chat_format(directory: Path, tokenizer: HFTokenizer) -> ChatFormat | None:
    """The chat format of an HF checkpoint ``directory`` (see the module docstring); None if it has no template.

    A malformed ``tokenizer_config.json`` or ``generation_config.json`` raises ``ValueError``
    naming the file.
    """
    directory = Path(directory)
    config_file = directory / "tokenizer_config.json"
    config = _read_json(config_file)
    template: Any = config.get("chat_template")
    source = str(config_file)
    if isinstance(template, list):  # [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not isinstance(template, str) or not template:
        jinja_file = directory / "chat_template.jinja"
        if not jinja_file.is_file():
            return None
        template, source = jinja_file.read_text(encoding="utf-8"), str(jinja_file)
    specials = {
        name: text
        for name in ("bos_token", "eos_token", "unk_token", "pad_token")
        if (text := _token_text(config.get(name))) is not None
    }
    ends: list[int] = [tokenizer.eos_id]
    generation = _read_json(directory / "generation_config.json").get("eos_token_id")
    for value in generation if isinstance(generation, list) else [generation]:
        if isinstance(value, int) and not isinstance(value, bool):
            ends.append(value)
    names = [specials["eos_token"]] if "eos_token" in specials else []
    names += [t for t in _END_OF_TURN_TOKENS if t in template]
    for name in names:
        found = tokenizer.token_id(name)
        if found is not None:
            ends.append(found)
    return ChatFormat(template, tuple(dict.fromkeys(ends)), tuple(specials.items()), source)
