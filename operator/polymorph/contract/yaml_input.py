"""Reading YAML safely, for the whole trusted package: manifests, workloads, traces, profiles.

Duplicate keys are errors (the API server's strict decoding refuses them too), YAML 1.1 merge keys
(``<<: *anchor``, the mapping's own keys overriding) are followed as the API server's reader
follows them, plain scalars resolve as that reader (go-yaml v2) resolves them (``y`` is a
boolean, ``1e3`` a number, ``2001-12-14`` a string) and a whole-number or boolean key is a string
key, as in the JSON the API server sees; broken YAML is
reported with its line, and hostile YAML is bounded: a document whose aliases expand past
``MAX_YAML_NODES`` nodes (a "billion laughs") or that nests deeper than ``MAX_YAML_DEPTH`` is
refused with a message before anything walks it, and a whole number longer than
``MAX_NUMBER_DIGITS`` digits is refused unread. Parsing uses libyaml when PyYAML has it, and
the work is linear in the size of the input (5,730 documents, 5 MB, in a second or two).
It knows nothing about what the documents mean.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import yaml

from polymorph.contract.errors import UsageError

__all__ = [
    "MAX_NUMBER_DIGITS",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "bounded_int",
    "documents",
    "load_yaml",
    "yaml_problem",
]

MAX_YAML_NODES = 100_000
"""The most nodes one YAML document may expand to, aliases followed (a manifest has a few hundred)."""
MAX_YAML_DEPTH = 100
"""The deepest nesting one YAML document may have."""

_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a document whose aliases expand past ``MAX_YAML_NODES`` or that nests past ``MAX_YAML_DEPTH``.

    Linear in the distinct nodes: each node's expanded size is computed once (aliases share
    node objects), iteratively, so neither size nor depth can exhaust the stack.
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            if sizes[key] > MAX_YAML_NODES:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"its aliases expand to more than {MAX_YAML_NODES} nodes; refusing it (write the values out)",
                    node.start_mark,
                )
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise yaml.constructor.ConstructorError(
                None, None, "an alias refers to the node that contains it", node.start_mark
            )
        if depth > MAX_YAML_DEPTH:
            raise yaml.constructor.ConstructorError(
                None, None, f"it nests deeper than {MAX_YAML_DEPTH} levels", node.start_mark
            )
        on_path.add(key)
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in _children(node) if id(child) not in sizes)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


class _Loader(_SafeLoader):  # type: ignore[valid-type,misc]
    """A safe loader that rejects duplicate keys (the API server's strict decoding does too) and
    bounds alias expansion and depth before constructing anything.

    Only a text with an anchor (``&``) can hold an alias, so only such a text pays for the walk
    that bounds expansion; without aliases a document's size is bounded by the text, and nesting
    too deep for the constructor surfaces as ``RecursionError``, which callers turn into one line.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._may_alias = not isinstance(stream, str) or "&" in stream

    def construct_document(self, node: yaml.Node) -> Any:
        if self._may_alias:
            _check_expansion(node)
        return super().construct_document(node)


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _merge_sources(value: yaml.Node) -> list[yaml.MappingNode]:
    """The mappings a ``<<`` value names: one mapping, or a sequence of them (YAML 1.1 merge keys)."""
    nodes = value.value if isinstance(value, yaml.SequenceNode) else [value]
    if not all(isinstance(n, yaml.MappingNode) for n in nodes):
        raise yaml.constructor.ConstructorError(
            None, None, "a merge key (<<) takes a mapping or a list of mappings", value.start_mark
        )
    return list(nodes)


def _mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    """A mapping with YAML 1.1 merge keys followed as the API server's reader follows them.

    ``<<: *anchor`` (or a list of anchors, the earlier winning) supplies keys the mapping does not
    set itself; a key set in the mapping overrides a merged one. A key the mapping sets twice is
    refused, and so is a key set *before* a ``<<`` that supplies it too: YAML 1.1 keeps the key,
    the API server's reader (go-yaml v2) lets the later merge replace it, so the two disagree."""
    merges = [(i, v) for i, (k, v) in enumerate(node.value) if k.tag == _MERGE_TAG]
    if len(merges) > 1:
        raise yaml.constructor.ConstructorError(
            None,
            None,
            "duplicate merge key (<<); merge several mappings with one << and a list [*a, *b]",
            node.value[merges[1][0]][0].start_mark,
        )
    own = {id(k) for k, _ in node.value if k.tag != _MERGE_TAG}
    for _, value in merges:
        for source in _merge_sources(value):
            loader.construct_object(source, deep=True)  # its own duplicate keys are refused there
    last_merge = merges[-1][0] if merges else -1
    before_merge = {id(k) for k, _ in node.value[:last_merge] if k.tag != _MERGE_TAG}
    loader.flatten_mapping(node)  # merged pairs first (earlier sources last), then the mapping's own
    seen: dict[Any, Any] = {}
    merged: set[Any] = set()
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, list | dict | set):
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value", key_node.start_mark
            )
        if isinstance(key, bool | int):  # JSON keys are strings: y: 1 is {"true": 1} to the API server
            key = ("true" if key else "false") if isinstance(key, bool) else str(key)
        if id(key_node) not in own:  # a merged pair: a later one (an earlier source) wins
            merged.add(key)
        elif key in seen and key not in merged:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", mark)
        elif key in merged and id(key_node) in before_merge:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"key {key!r} is set before a merge key (<<) that sets it too; put << first "
                "(the API server's reader lets the merge replace it, YAML 1.1 keeps it)",
                key_node.start_mark,
            )
        else:
            merged.discard(key)
        seen[key] = loader.construct_object(value_node, deep=deep)
    return seen


MAX_NUMBER_DIGITS = 18
"""The most digits a whole number in a manifest, workload or trace may have (fits 64 bits)."""


def bounded_int(text: str) -> int:
    """``int(text)`` for at most ``MAX_NUMBER_DIGITS`` digits; ``ValueError`` (refused unread) otherwise."""
    if sum(c.isdigit() for c in text) > MAX_NUMBER_DIGITS:
        raise ValueError(f"a number with more than {MAX_NUMBER_DIGITS} digits")
    return int(text)


def _int(loader: _Loader, node: yaml.ScalarNode) -> int:
    """A whole number as go-yaml v2 reads it: ``_`` dropped, then Go's base prefixes (``0x``, ``0o``,
    ``0b``, a leading ``0`` for octal)."""
    text = str(node.value).replace("_", "")
    if sum(c.isdigit() for c in text) > MAX_NUMBER_DIGITS:
        raise yaml.constructor.ConstructorError(
            None, None, f"a number with more than {MAX_NUMBER_DIGITS} digits is too large", node.start_mark
        )
    if re.fullmatch(r"[-+]?0[0-7]+", text):
        return int(text, 8)
    return int(text, 0)


def _float(loader: _Loader, node: yaml.ScalarNode) -> float:
    text = str(node.value).replace("_", "")
    if text.lower().lstrip("+-") in (".inf", ".nan"):
        return float(loader.construct_yaml_float(node))
    return float(text)


def _bool(loader: _Loader, node: yaml.ScalarNode) -> bool:
    return str(node.value).lower() in ("y", "yes", "true", "on")


# Plain scalars resolve as go-yaml v2 resolves them (kubectl turns YAML into JSON with it before the
# API server sees it), not as PyYAML's YAML 1.1 tables do: y/Y/n/N are booleans; 1e3 and 1.5e3 are
# numbers; 0o17 is a whole number; 1:20 (sexagesimal) and 2001-12-14 (a timestamp) stay strings.
_GO_RESOLVED = ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp")  # fmt: skip
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _GO_RESOLVED]
    for first, resolvers in _SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$"),
    list("yYnNtTfFoO"),
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^[-+]?(?:0[bB][01_]+|0[oO][0-7_]+|0[xX][0-9a-fA-F_]+|0[0-7_]*|[1-9][0-9_]*)$"),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9][0-9_]*|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_Loader.add_constructor("tag:yaml.org,2002:int", _int)
_Loader.add_constructor("tag:yaml.org,2002:float", _float)
_Loader.add_constructor("tag:yaml.org,2002:bool", _bool)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for a YAML error: where it is (line and column) and what is wrong."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    what = f"{context}: {problem}" if context and "duplicate" not in problem else problem
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"invalid YAML{where}: {what}"


def documents(text: str) -> Iterator[Any]:
    """Every YAML document in ``text``, read by the bounded, duplicate-refusing loader."""
    yield from yaml.load_all(text, Loader=_Loader)  # _Loader is a SafeLoader


def load_yaml(text: str, source: str) -> Any:
    """The one YAML (or JSON) document in ``text``, read as ``polymorph validate`` reads manifests.

    Duplicate keys, broken YAML, aliases expanding past ``MAX_YAML_NODES`` and more than one
    document are a ``UsageError`` that starts with ``source``; an empty text is None.
    """
    try:
        docs = list(documents(text))
    except yaml.YAMLError as exc:
        raise UsageError(f"{source}: {yaml_problem(exc)}") from None
    except RecursionError:
        raise UsageError(f"{source}: invalid YAML: it nests too deeply") from None
    if len(docs) > 1:
        raise UsageError(f"{source}: holds {len(docs)} YAML documents; expected one")
    return docs[0] if docs else None
