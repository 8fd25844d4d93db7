"""Chat messages checked and rendered into one prompt with the checkpoint's own chat template.

Contract:
- ``chat_messages(raw)`` checks an OpenAI ``messages`` list: objects with a ``role`` (system,
  developer, user or assistant; developer is given to the template as system) and a
  ``content`` that is a string or a list of text parts (``{"type": "text", "text": ...}``,
  joined without a separator, as OpenAI does), and optionally ``name``. Anything else (an image
  part, a tool turn, non-empty ``tool_calls``, an unknown key) is a ``RequestError`` naming the
  place, e.g. ``messages[2].content[0].type``. The keys an answer's message carries empty
  (``refusal``, ``tool_calls``, ``function_call``, ``annotations``, ``audio``: null or []) are
  taken, so a client may append the previous answer's message as it came.
- ``render_chat(chat, messages)`` renders them as transformers' ``apply_chat_template`` does:
  a ``jinja2.sandbox.ImmutableSandboxedEnvironment`` with ``trim_blocks`` and
  ``lstrip_blocks``, the ``loopcontrols`` extension, a ``{% generation %}`` block (rendered
  as its body), ``raise_exception``, ``strftime_now`` and transformers' ``tojson``; the
  variables are ``messages``, ``add_generation_prompt=True`` and the special-token strings
  (``bos_token``, ``eos_token``, ...). A template that raises (``raise_exception("Conversation
  roles must alternate ...")``) or fails is a 400 quoting its message, never a stack trace.
  Templates are compiled once per text.

The rendered text is encoded by the caller without the tokenizer's own special tokens, since
the template prints them. It knows nothing about HTTP, models or the scheduler.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from polymorph_engine.runtime.tokenizer import ChatFormat
from polymorph_engine.serving.openai_api import RequestError

__all__ = ["ROLES", "chat_messages", "render_chat"]

ROLES = ("system", "developer", "user", "assistant")
_TEMPLATE_ROLE = {"developer": "system"}
_MESSAGE_KEYS = ("role", "content", "name")
_EMPTY_KEYS = ("refusal", "tool_calls", "function_call", "annotations", "audio")
"""Keys of an assistant message as the API returns it, taken when empty (null or []): a client
that appends the previous answer's message object to ``messages`` sends them."""


def chat_messages(raw: Any) -> list[dict[str, str]]:
    """``messages`` as the template sees them: ``{"role", "content"[, "name"]}`` with string content."""
    if not isinstance(raw, list) or not raw:
        raise RequestError(
            'messages must be a non-empty list of messages like {"role": "user", "content": "Hi"}.',
            param="messages",
        )
    out: list[dict[str, str]] = []
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestError(
                f'{where} must be an object like {{"role": "user", "content": "Hi"}}.', param=where
            )
        for key, value in message.items():
            if key in _EMPTY_KEYS and value in (None, []):
                continue
            if key not in _MESSAGE_KEYS:
                what = (
                    "tool calls are"
                    if key in ("tool_calls", "function_call", "tool_call_id")
                    else f"{key} is"
                )
                raise RequestError(
                    f"{where}.{str(key)[:40]}: {what} not supported by this engine; a message holds "
                    f"{', '.join(_MESSAGE_KEYS)}.",
                    param=f"{where}.{str(key)[:40]}",
                )
        role = message.get("role")
        if role not in ROLES:
            shown = repr(role)[:40] if role is not None else "missing"
            raise RequestError(
                f"{where}.role must be one of {', '.join(ROLES)} (tool turns are not supported), got {shown}.",
                param=f"{where}.role",
            )
        turn: dict[str, str] = {
            "role": str(_TEMPLATE_ROLE.get(role, role)),
            "content": _content(message.get("content"), where),
        }
        name = message.get("name")
        if name is not None:
            if not isinstance(name, str):
                raise RequestError(f"{where}.name must be a string.", param=f"{where}.name")
            turn["name"] = name
        out.append(turn)
    return out


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(
            f'{where}.content must be a string or a list of text parts like {{"type": "text", "text": "Hi"}}.',
            param=f"{where}.content",
        )
    texts: list[str] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(part, dict):
            raise RequestError(f'{at} must be a text part like {{"type": "text", "text": "Hi"}}.', param=at)
        if part.get("type") != "text":
            shown = repr(part.get("type"))[:40]
            raise RequestError(
                f'{at}.type must be "text" (this engine reads text only), got {shown}.', param=f"{at}.type"
            )
        extra = [k for k in part if k not in ("type", "text")]
        if extra:
            raise RequestError(
                f"{at}.{str(extra[0])[:40]} is not a field of a text part; it holds type and text.",
                param=f"{at}.{str(extra[0])[:40]}",
            )
        if not isinstance(part.get("text"), str):
            raise RequestError(f"{at}.text must be a string.", param=f"{at}.text")
        texts.append(part["text"])
    return "".join(texts)


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers marks assistant text with it): its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # transformers' tojson: unlike jinja2's own, it does not escape HTML characters.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@functools.lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def render_chat(chat: ChatFormat, messages: list[dict[str, str]]) -> str:
    """The prompt text for ``messages`` with ``add_generation_prompt`` (see the module contract)."""
    try:
        template = _compile(chat.template)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise RequestError(
            f"this model's chat template ({chat.source}) does not parse: {exc.message} (line {exc.lineno}).",
            status=500,
            code="chat_template_invalid",
        ) from None
    try:
        return template.render(messages=messages, add_generation_prompt=True, **dict(chat.special_tokens))
    except jinja2.exceptions.TemplateError as exc:  # raise_exception(...), or a sandbox refusal
        raise RequestError(
            f"this model's chat template refused these messages: {str(exc)[:300]}", param="messages"
        ) from None
    except Exception as exc:  # a template bug meeting these messages (a TypeError in a filter, ...)
        raise RequestError(
            f"this model's chat template failed on these messages: {type(exc).__name__}: {str(exc)[:300]}",
            param="messages",
        ) from None
