"""The one YAML loader of topotrain: safe, fast (libyaml when present) and guarded against hostile files.

:func:`safe_load` is a drop-in for :func:`yaml.safe_load` (its errors are :class:`yaml.YAMLError`\\ s with a
``problem`` and a ``problem_mark``, so every caller's message keeps its line and column) that also refuses:

* **alias bombs** ("billion laughs"): anchors and aliases let a 600-byte document stand for 10^9 values; the
  composed node graph is measured before anything is built, and a document whose aliases add more than
  MAX_ALIAS_EXPANSION values to the tree, or that refers to itself, is refused — in milliseconds;
* **nesting deeper than MAX_DEPTH** (the constructor recurses; a deeper document would end in RecursionError);
* **duplicate keys** in one mapping (YAML 1.2 §3.2.1.1 requires unique keys; PyYAML silently keeps the last),
  named with the line of the second occurrence. A merge key (``<<: *base``) may still be overridden.

Built on ``yaml.CSafeLoader`` (libyaml's parser, several times faster on large graph files) when PyYAML has
it, else on the pure-Python ``yaml.SafeLoader``; both give the same objects.
"""

from __future__ import annotations

import os
import stat
from typing import IO, Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, SequenceNode

from topotrain.util.errors import ConfigError

#: Most values aliases may add to a document when expanded (a legitimate file reuses a few small blocks).
MAX_ALIAS_EXPANSION = 100_000
#: Largest input file read (a 65,536-GPU graph file in YAML is about 30 MiB); larger ones are refused unread.
MAX_INPUT_BYTES = 256 * 1024 * 1024
#: Deepest nesting of collections accepted (scenarios and graph files are a handful of levels deep).
MAX_DEPTH = 64

_MERGE_TAG = "tag:yaml.org,2002:merge"
_Base: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlLimitError(ConstructorError):
    """A document over a limit of this module (alias expansion, depth) or with a duplicate key."""


def _children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, SequenceNode):
        return list(node.value)
    return []


def check_node_graph(root: Node, *, max_expansion: int = MAX_ALIAS_EXPANSION, max_depth: int = MAX_DEPTH) -> int:
    """The number of values ``root`` stands for once every alias is expanded (iterative, memoized: linear in
    the composed graph), or a :class:`YamlLimitError` for a recursive alias, too deep a nesting, or aliases
    that add more than ``max_expansion`` values."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Node, int, bool]] = [(root, 0, False)]
    while stack:
        node, depth, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            if size[key] - len(size) > max_expansion:
                raise YamlLimitError(None, None, f"aliases expand this document past {max_expansion:,} values "
                                     "(an alias bomb?); write the values out or reuse fewer anchors",
                                     node.start_mark)
            continue
        if key in size:
            continue
        if key in on_path:
            raise YamlLimitError(None, None, "an alias refers to a collection that contains it (recursive "
                                 "document)", node.start_mark)
        if depth > max_depth:
            raise YamlLimitError(None, None, f"nested deeper than {max_depth} levels", node.start_mark)
        on_path.add(key)
        stack.append((node, depth, True))
        stack.extend((c, depth + 1, False) for c in _children(node) if id(c) not in size)
    return size[id(root)]


class SafeLoader(_Base):
    """``yaml.CSafeLoader`` (or ``yaml.SafeLoader``) with the checks of the module docstring."""

    def construct_document(self, node: Node) -> Any:
        check_node_graph(node)
        return super().construct_document(node)

    def construct_mapping(self, node: Node, deep: bool = False) -> Any:
        if isinstance(node, MappingNode):
            seen: dict[Any, Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # unhashable: the base class reports it
                    continue
                if first is not None:
                    raise YamlLimitError("while constructing a mapping", node.start_mark,
                                         f"duplicate key {_short(key)} (first at line {first.start_mark.line + 1})",
                                         key_node.start_mark)
                seen[key] = key_node
        return super().construct_mapping(node, deep)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _NotPlain(Exception):
    """The document uses a feature the event-driven fast path leaves to the full loader."""


#: Tags the fast path builds (PyYAML's implicit ones but ``merge`` and ``value``).
_FAST_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "timestamp"))
# (a merge key ``<<`` resolves to ``merge``: the full loader merges it)
_STR_TAG = "tag:yaml.org,2002:str"
_NO_KEY = object()  # a mapping waiting for its next key


def _fast_load(text: str | bytes) -> Any:
    """The document built straight from libyaml's parser events, for plain documents: no anchors or aliases,
    no explicit tags, no merge keys, scalar keys, one document. Equal to :class:`SafeLoader`'s result (scalars
    are typed by PyYAML's own resolver and constructors; the same depth and duplicate-key checks); anything
    else raises :class:`_NotPlain` and the full loader runs. Why: composing PyYAML's node graph and resolving it
    in Python costs 10–15 µs per scalar (7 s for an 8,192-GPU graph file), the parser's events 0.6 µs."""
    from yaml import events as ev

    resolver = yaml.resolver.Resolver()
    implicit = resolver.yaml_implicit_resolvers
    constructor = yaml.constructor.SafeConstructor()
    build = constructor.yaml_constructors

    def scalar(e: Any) -> Any:
        if not e.implicit[0]:  # quoted: a string
            return e.value
        v = e.value
        if (v[:1] if v else "") not in implicit and None not in implicit:
            return v
        tag = resolver.resolve(yaml.ScalarNode, v, (True, False))
        if tag == _STR_TAG:
            return v
        if tag not in _FAST_TAGS:
            raise _NotPlain
        return build[tag](constructor, yaml.ScalarNode(tag, v, e.start_mark, e.end_mark))

    # a stack of open collections: [container, start event, pending key, keys seen: key -> its event]
    stack: list[list[Any]] = []
    root: Any = None
    docs = 0
    e: Any  # libyaml's events and marks (typed loosely in the stubs)
    for e in yaml.parse(text, Loader=_Base):
        cls = type(e)
        if cls is ev.ScalarEvent or cls is ev.MappingStartEvent or cls is ev.SequenceStartEvent:
            if e.anchor is not None or e.tag is not None:
                raise _NotPlain
            if len(stack) > MAX_DEPTH:  # a node's depth is the number of collections around it
                raise YamlLimitError(None, None, f"nested deeper than {MAX_DEPTH} levels", e.start_mark)
        if cls is ev.ScalarEvent:
            value = scalar(e)
        elif cls is ev.MappingStartEvent or cls is ev.SequenceStartEvent:
            if stack and isinstance(stack[-1][0], dict) and stack[-1][2] is _NO_KEY:
                raise _NotPlain  # a collection as a mapping key (the full loader refuses it)
            stack.append([{} if cls is ev.MappingStartEvent else [], e, _NO_KEY, {}])
            continue
        elif cls is ev.MappingEndEvent or cls is ev.SequenceEndEvent:
            value = stack.pop()[0]
        elif cls is ev.AliasEvent:
            raise _NotPlain
        elif cls is ev.DocumentStartEvent:
            docs += 1
            if docs > 1:
                raise _NotPlain  # several documents: the full loader's error
            continue
        else:  # stream start/end, document end
            continue
        if not stack:
            root = value
            continue
        top = stack[-1]
        c = top[0]
        if isinstance(c, list):
            c.append(value)
        elif top[2] is _NO_KEY:
            first = top[3].get(value)
            if first is not None:
                raise YamlLimitError("while constructing a mapping", top[1].start_mark,
                                     f"duplicate key {_short(value)} (first at line {first.start_mark.line + 1})",
                                     e.start_mark)
            top[3][value] = e
            top[2] = value
        else:
            c[top[2]] = value
            top[2] = _NO_KEY
    return root



def safe_load(stream: str | bytes | IO[str] | IO[bytes]) -> Any:
    """:func:`yaml.safe_load` with the limits of this module: the event-driven fast path for a plain document,
    the guarded full loader for any other."""
    text = stream if isinstance(stream, str | bytes) else stream.read()
    try:
        if _Base is not yaml.SafeLoader:
            try:
                return _fast_load(text)
            except _NotPlain:
                pass
        loader = SafeLoader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except ValueError as e:  # a scalar its constructor refuses, e.g. an integer of thousands of digits
        if isinstance(e, yaml.YAMLError):
            raise
        raise YamlLimitError(None, None, f"a value cannot be read: {str(e).split(';')[0]}", None) from None


def read_text(path: str | os.PathLike[str], field: str) -> str:
    """The text of an input file, or a one-line ConfigError naming ``field``: a file that is missing, not a
    regular file (a folder, a device such as ``/dev/zero``), unreadable, or not UTF-8 text (the offset of
    the first bad byte is given), or larger than :data:`MAX_INPUT_BYTES` (refused by its size before it is
    read; a file that grows while it is read is cut at the limit and refused too)."""
    p = os.fspath(path)
    too_big = ConfigError(field, f"{p} is larger than {MAX_INPUT_BYTES / 2**20:g} MiB, the most topotrain reads "
                          "from one input file", "give a smaller file (is this the right path?)")
    try:
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(field, f"{p} is not a regular file", "give the path of a text file")
        if st.st_size > MAX_INPUT_BYTES:
            raise too_big
        with open(p, "rb") as fh:
            data = fh.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES:
            raise too_big
    except FileNotFoundError:
        raise ConfigError(field, f"{p}: file not found", "check the path") from None
    except OSError as e:
        raise ConfigError(field, f"cannot read {p}: {e.strerror or e}", "check the path") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(field, f"{p} is not UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r})",
                          "save it as UTF-8") from None
