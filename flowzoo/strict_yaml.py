"""YAML that means one thing: PyYAML's safe loader, with what it lets pass silently refused.

* a key given twice in one mapping (PyYAML keeps the last one: ``seed: 1`` then ``seed: 2`` trains seed 2);
* a number that YAML 1.1 (PyYAML) and YAML 1.2 read differently: ``010`` (octal 8, or 10) and ``1:30``
  (sexagesimal 90, or a string);
* nesting deeper than :data:`MAX_DEPTH` levels (no config goes past a handful; thousands of levels exhaust Python's
  recursion inside the parser, and every later walk over the tree);
* a document that expands to more than :data:`MAX_VALUES` values, counted on the parsed node graph before anything
  is built, each alias counted as the copy it stands for (a "billion laughs": a few hundred bytes of nested aliases
  that expand to 10^8 leaves took minutes in every walk over the tree); an alias that contains itself;
* a text longer than :data:`MAX_CHARS` characters.

Each is a :class:`ConfigError` naming the source (and the line where there is one), as a syntax error is.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from typing import Any

import yaml

from flowzoo.errors import ConfigError

#: deepest nesting of mappings and lists accepted (configs use <= 5)
MAX_DEPTH = 64
#: most values (scalars, mappings, lists) a document may expand to, aliases expanded (configs and suites hold hundreds)
MAX_VALUES = 100_000
#: longest text accepted (the longest shipped suite is a few kB)
MAX_CHARS = 10_000_000


class NotYAML(ConfigError):
    """The text is not YAML at all (a syntax error); a command-line override then keeps it as plain text."""


class _Ambiguous(yaml.YAMLError):
    """A value YAML 1.1 and 1.2 read differently (raised while loading, turned into a ConfigError naming it)."""


class _StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)  # merge keys (<<) first: a merged key may be overridden, that is YAML
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:  # an unhashable key: PyYAML's own error follows
                    continue
                if duplicate:
                    raise _Ambiguous(f"the key {key!r} is given twice (line {key_node.start_mark.line + 1}); "
                                        f"give each key once")
                seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        text = self.construct_scalar(node).replace("_", "").lstrip("+-")
        if ":" in text or (len(text) > 1 and text[0] == "0" and text[1] not in "xXbB"):
            value = super().construct_yaml_int(node)
            raise _Ambiguous(f"{node.value!r} (line {node.start_mark.line + 1}) is {value} in YAML 1.1 but not in "
                             f"YAML 1.2; write the number without a leading 0 or ':', or quote it as a string")
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node):
        if ":" in self.construct_scalar(node):
            value = super().construct_yaml_float(node)
            raise _Ambiguous(f"{node.value!r} (line {node.start_mark.line + 1}) is {value} in YAML 1.1 (base 60) but "
                             f"not in YAML 1.2; write the number, or quote it as a string")
        return super().construct_yaml_float(node)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_yaml_float)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for kv in node.value for n in kv]
    return []


def check_expansion(node: yaml.Node, source: str) -> None:
    """``ConfigError`` when the tree ``node`` stands for is deeper than ``MAX_DEPTH``, holds more than ``MAX_VALUES``
    values or contains itself. Each node of the graph is visited once (an alias is the node it names, so its
    expanded depth and size are known from its first visit): linear in the text, whatever the aliases expand to."""
    memo: dict[int, tuple[int, int]] = {}  # id(node) -> (nesting depth, values) of its expanded tree
    open_: set[int] = set()  # nodes whose subtree is being walked: meeting one again is a cycle
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:
        current, finished = stack.pop()
        key = id(current)
        if finished:
            open_.discard(key)
            kids = [memo[id(child)] for child in _children(current)]
            nested = isinstance(current, (yaml.MappingNode, yaml.SequenceNode))
            depth = nested + max((d for d, _ in kids), default=0)
            values = 1 + sum(v for _, v in kids)
            if depth > MAX_DEPTH:
                raise ConfigError(f"{source}: nested deeper than {MAX_DEPTH} levels; a config is a few levels of "
                                  f"mappings and lists")
            if values > MAX_VALUES:
                raise ConfigError(f"{source}: expands to more than {MAX_VALUES:,} values (line "
                                  f"{current.start_mark.line + 1}; YAML aliases count as the copies they stand for); "
                                  f"a config holds hundreds")
            memo[key] = (depth, values)
        elif key in open_:
            raise ConfigError(f"{source}: an alias at line {current.start_mark.line + 1} contains itself; a config "
                              f"is a tree")
        elif key not in memo:
            open_.add(key)
            stack.append((current, True))
            stack.extend((child, False) for child in _children(current) if id(child) not in memo)


#: texts of at most this many characters have their value memoised (configs, suites and recipe files are a few kB)
MEMO_MAX_CHARS = 65_536
_MEMO_ENTRIES = 512
_memo: OrderedDict[str, Any] = OrderedDict()
_memo_lock = threading.Lock()
_MISSING = object()


def load(text: str, source: str) -> Any:
    """The value of YAML ``text`` (module docstring), or a one-line :class:`ConfigError` starting with ``source``.

    The value is a pure function of the text, so a text seen before (a recipe file read for every config a suite
    expands: ~5 ms of pure-Python parsing each time) is answered from a per-process memo; each caller gets its own
    copy. A text that fails is not memoised: it fails again with its own ``source``."""
    if len(text) > MAX_CHARS:
        raise ConfigError(f"{source}: {len(text):,} characters, more than {MAX_CHARS:,}; a config is a few kB")
    if len(text) > MEMO_MAX_CHARS:
        return _load(text, source)
    with _memo_lock:
        value = _memo.get(text, _MISSING)
        if value is not _MISSING:
            _memo.move_to_end(text)
    if value is _MISSING:
        value = _load(text, source)
        with _memo_lock:
            _memo[text] = value
            while len(_memo) > _MEMO_ENTRIES:
                _memo.popitem(last=False)
    return copy.deepcopy(value)


def _load(text: str, source: str) -> Any:
    try:
        loader = _StrictLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            check_expansion(node, source)  # before anything is built
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except _Ambiguous as e:
        raise ConfigError(f"{source}: {e}") from None
    except RecursionError:  # the parser's own recursion, before the depth check could run
        raise ConfigError(f"{source}: nested deeper than {MAX_DEPTH} levels; a config is a few levels of mappings "
                          f"and lists") from None
    except yaml.YAMLError as e:
        raise NotYAML(f"{source}: not valid YAML ({str(e).splitlines()[0]})") from None
