"""YAML that means one thing: PyYAML's safe loader, with what it lets pass silently refused.

* a key given twice in one mapping (PyYAML keeps the last one: ``seed: 1`` then ``seed: 2`` trains seed 2);
* a number that YAML 1.1 (PyYAML) and YAML 1.2 read differently: ``010`` (octal 8, or 10) and ``1:30``
  (sexagesimal 90, or a string);
* nesting deeper than :data:`MAX_DEPTH` levels (no config goes past a handful; thousands of levels exhaust Python's
  recursion inside the parser, and every later walk over the tree).

Both are a :class:`ConfigError` naming the source and the line, as a syntax error is.
"""

from __future__ import annotations

from typing import Any

import yaml

from flowzoo.errors import ConfigError

#: deepest nesting of mappings and lists accepted (configs use <= 5)
MAX_DEPTH = 64


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


def _too_deep(node: yaml.Node, limit: int) -> bool:
    stack = [(node, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            if depth > limit:
                return True
            children = node.value if isinstance(node, yaml.SequenceNode) else [n for kv in node.value for n in kv]
            stack.extend((child, depth + 1) for child in children)
    return False


def load(text: str, source: str) -> Any:
    """The value of YAML ``text`` (module docstring), or a one-line :class:`ConfigError` starting with ``source``."""
    try:
        loader = _StrictLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            if _too_deep(node, MAX_DEPTH):
                raise ConfigError(f"{source}: nested deeper than {MAX_DEPTH} levels; a config is a few levels of "
                                  f"mappings and lists")
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
