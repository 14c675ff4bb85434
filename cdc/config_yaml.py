"""The config file's YAML: its data and the line of every field, bounded.

``load_yaml(text, name)`` parses once and composes the nodes itself (rather
than with libyaml's composer) so that, in the same pass:

- every field's line is recorded (``Lines``: path -> line), and a key given
  twice in a mapping is an error naming both lines;
- nesting deeper than ``MAX_DEPTH`` levels is refused (the constructor would
  hit Python's recursion limit), with the same message when libyaml's own
  limit of 1,000 levels stops the scanner first;
- an alias that refers to the node containing it is refused at its line (the
  data would be infinite);
- what aliases repeat is counted without building it: past ``ALIAS_BUDGET``
  values the file is refused, naming the alias that repeats the most (an
  "alias bomb" of a few lines expands to gigabytes in every later step).

Messages quote values through ``shown`` and free text through ``cut``: a value
is cut to ``SHOWN`` characters, so that a 50 MB value is not echoed whole.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.events import (
    AliasEvent,
    MappingEndEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
)
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from cdc.errors import ConfigError

Path = tuple[str | int, ...]
Lines = dict[Path, int]

SHOWN = 80  # characters of a value quoted in a message
MAX_DEPTH = 64  # levels of nesting; the deepest valid config has 5
# Values that aliases may repeat: as many as the file writes itself, and at
# least this many in a small file (50,000 tables sharing one backoff list stay
# well inside; a "billion laughs" of nine lines does not).
ALIAS_BUDGET = 100_000

# What a mapping key may be: a string, or the merge key "<<" of YAML 1.1.
_NAME_TAGS = frozenset({"tag:yaml.org,2002:str", "tag:yaml.org,2002:merge"})
_KEY = -1  # the path of a mapping's key node: never a field's (a mapping has no index)
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when built with it


class FieldError(ValueError):
    """An error at a path of the file; ``locate`` turns it into the message."""

    def __init__(self, where: Path, message: str) -> None:
        super().__init__(where, message)
        self.where = where
        self.message = message


def cut(text: str, limit: int = SHOWN) -> str:
    """``text``, or its first ``limit`` characters and "…"."""
    return text if len(text) <= limit else text[:limit] + "…"


def shown(value: Any) -> str:
    """``repr(value)`` for a message, cut to ``SHOWN`` characters."""
    if isinstance(value, str | bytes) and len(value) > SHOWN:
        return cut(repr(value[: SHOWN + 1]))  # never the repr of 50 MB
    return cut(repr(value))


def locate(name: str, lines: Lines, path: Path, message: str) -> str:
    """``name:line: field: message``, the line of ``path`` or of its nearest
    ancestor with one (a key that is missing has no line of its own)."""
    probe = tuple(path)
    while probe and probe not in lines:
        probe = probe[:-1]
    line = lines.get(probe, 1)
    field_name = dotted(path) or "(top level)"
    return f"{name}:{line}: {field_name}: {message}"


def dotted(path: Path) -> str:
    """``tables[0].backoff[1]``; a key longer than ``SHOWN`` is cut."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{cut(part)}" if out else cut(part))
    return out


def load_yaml(text: str, name: str) -> tuple[Any, Lines]:
    """The data of the one document in ``text`` and the line of each field."""
    lines: Lines = {}
    try:
        data = _parse(text, lines)
    except FieldError as exc:
        raise ConfigError(locate(name, lines, exc.where, exc.message)) from None
    except yaml.reader.ReaderError as exc:  # a control character: no mark, a position
        line = text.count("\n", 0, exc.position) + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise ConfigError(
            f"{name}:{line}: malformed YAML: control character U+{code:04X} is not allowed"
        ) from None
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark is not None else 1
        problem = exc.problem or str(exc)
        if exc.context and exc.context_mark is not None and exc.context_mark.line + 1 != line:
            problem = f"{exc.context} on line {exc.context_mark.line + 1}, {problem}"
        raise ConfigError(f"{name}:{line}: malformed YAML: {cut(problem, 4 * SHOWN)}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{name}:1: malformed YAML: {cut(str(exc), 4 * SHOWN)}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{name}:1: (top level): the config must be a mapping with source, redis, worker, tables"
        )
    return data, lines


def _parse(text: str, lines: Lines) -> Any:
    loader = _Loader(text)
    try:
        node = _Composer(loader, lines).single_document()
        return loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()


class _Composer:
    """yaml.composer.Composer's walk over the parser's events, plus the lines,
    the bounds and the alias count. Aliases share their anchor's node, as in
    PyYAML, so nothing is repeated here; ``_Node.size`` counts what would be."""

    def __init__(self, loader: Any, lines: Lines) -> None:
        self.loader = loader
        self.lines = lines
        self.anchors: dict[str, tuple[Node, int]] = {}  # anchor -> node, its size with aliases expanded
        self.open: set[str] = set()  # anchors of the collections being composed
        self.written = 0  # nodes written in the file
        self.biggest: tuple[int, Path, str] | None = None  # the alias that repeats the most

    def single_document(self) -> Node | None:
        loader = self.loader
        loader.get_event()  # stream start
        if loader.check_event(yaml.StreamEndEvent):
            return None
        loader.get_event()  # document start
        node, size = self.node((), 0)
        loader.get_event()  # document end
        if not loader.check_event(yaml.StreamEndEvent):
            event = loader.get_event()
            raise yaml.composer.ComposerError(
                "expected a single document in the stream",
                node.start_mark,
                "but found another document",
                event.start_mark,
            )
        self._check_budget(size)
        return node

    def node(self, path: Path, depth: int) -> tuple[Node, int]:
        """The node at ``path`` and its size with every alias expanded."""
        try:
            return self._node(path, depth)
        except yaml.scanner.ScannerError as exc:
            # libyaml 0.2.5 (PyYAML 6.0.4's wheels) stops at 1,000 levels while
            # scanning ahead, before this walk reaches MAX_DEPTH: the same refusal,
            # at the deepest field reached and the line where the scanner stopped
            if "nesting depth" not in (exc.problem or ""):
                raise
            if path not in self.lines and exc.problem_mark is not None:
                self.lines[path] = exc.problem_mark.line + 1
            raise FieldError(path, f"nested deeper than {MAX_DEPTH} levels") from None

    def _node(self, path: Path, depth: int) -> tuple[Node, int]:
        loader = self.loader
        if loader.check_event(AliasEvent):
            return self._alias(path, loader.get_event())
        event = loader.peek_event()
        self.lines[path] = event.start_mark.line + 1
        anchor = event.anchor
        if anchor is not None and anchor in self.anchors:
            raise yaml.composer.ComposerError(
                f"found duplicate anchor {cut(anchor)!r}; first occurrence",
                self.anchors[anchor][0].start_mark,
                "second occurrence",
                event.start_mark,
            )
        self.written += 1
        if loader.check_event(ScalarEvent):
            node: Node = self._scalar(loader.get_event())
            size = 1
        else:
            if depth >= MAX_DEPTH:
                raise FieldError(path, f"nested deeper than {MAX_DEPTH} levels")
            if anchor is not None:
                self.open.add(anchor)
            if loader.check_event(SequenceStartEvent):
                node, size = self._sequence(path, depth)
            else:
                node, size = self._mapping(path, depth)
            if anchor is not None:
                self.open.discard(anchor)
        if anchor is not None:
            self.anchors[anchor] = (node, size)
        return node, size

    def _alias(self, path: Path, event: Any) -> tuple[Node, int]:
        self.lines[path] = event.start_mark.line + 1
        anchor = event.anchor
        if anchor in self.open:
            raise FieldError(
                path,
                f"the alias *{cut(anchor)} refers to a value that contains it, which would be "
                "infinite: repeat a value with an alias, never inside itself",
            )
        if anchor not in self.anchors:
            raise yaml.composer.ComposerError(
                None, None, f"found undefined alias {cut(anchor)!r}", event.start_mark
            )
        node, size = self.anchors[anchor]
        if self.biggest is None or size > self.biggest[0]:
            self.biggest = (size, path, anchor)
        return node, size

    def _scalar(self, event: Any) -> Node:
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.loader.resolve(ScalarNode, event.value, event.implicit)
        return ScalarNode(tag, event.value, event.start_mark, event.end_mark, style=event.style)

    def _sequence(self, path: Path, depth: int) -> tuple[Node, int]:
        start = self.loader.get_event()
        node = SequenceNode(self._tag(start, SequenceNode), [], start.start_mark, None, start.flow_style)
        size = 1
        while not self.loader.check_event(SequenceEndEvent):
            item, item_size = self.node((*path, len(node.value)), depth + 1)
            node.value.append(item)
            size += item_size
        node.end_mark = self.loader.get_event().end_mark
        return node, size

    def _mapping(self, path: Path, depth: int) -> tuple[Node, int]:
        start = self.loader.get_event()
        node = MappingNode(self._tag(start, MappingNode), [], start.start_mark, None, start.flow_style)
        size = 1
        while not self.loader.check_event(MappingEndEvent):
            key_line = self.loader.peek_event().start_mark.line + 1
            key, key_size = self.node((*path, _KEY), depth + 1)
            child = (*path, str(key.value) if isinstance(key, ScalarNode) else "(complex key)")
            if not (isinstance(key, ScalarNode) and key.tag in _NAME_TAGS):
                self.lines[child] = key_line
                raise FieldError(child, "a key must be a name (quote a key such as 1, true or null)")
            if child in self.lines:  # YAML would silently keep the last one
                first = self.lines[child]
                self.lines[child] = key_line
                raise FieldError(child, f"duplicate key (first given on line {first})")
            value, value_size = self.node(child, depth + 1)
            self.lines[child] = key_line  # a field's line is its key's
            node.value.append((key, value))
            size += key_size + value_size
        node.end_mark = self.loader.get_event().end_mark
        return node, size

    def _tag(self, event: Any, kind: type[Node]) -> str:
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.loader.resolve(kind, None, event.implicit)
        return str(tag)

    def _check_budget(self, size: int) -> None:
        repeated = size - self.written
        if repeated <= max(ALIAS_BUDGET, self.written) or self.biggest is None:
            return
        biggest, path, anchor = self.biggest
        raise FieldError(
            path,
            f"YAML aliases repeat {repeated:,} values, more than the file's own {self.written:,} "
            f"and more than {ALIAS_BUDGET:,}: refused (the alias *{cut(anchor)} alone repeats "
            f"{biggest:,}). Write the values out, or share less through aliases",
        )
