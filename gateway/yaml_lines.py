"""Where each value of a YAML document sits: the line of every mapping key and list item, by path.

`gateway check-config` names the line of each problem it finds, not only of YAML syntax errors:
the loader's errors carry a path such as `("tenants", 0, "policy")`, and `YamlLines.line(path)`
answers the line of that value, or of its nearest ancestor that is in the file (a missing field
is reported at the mapping that lacks it).
"""
from __future__ import annotations

from typing import Any, Hashable

import yaml


class YamlLines:
    def __init__(self, lines: dict[tuple[Hashable, ...], int]) -> None:
        self._lines = lines

    @classmethod
    def of(cls, text: str) -> "YamlLines":
        """The lines of a document that `yaml.safe_load` reads (an empty table for an empty one)."""
        lines: dict[tuple[Hashable, ...], int] = {}
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        if root is not None:
            _walk(root, (), lines)
        return cls(lines)

    def line(self, path: tuple[Any, ...]) -> int | None:
        """1-based line of the value at `path`, else of its nearest ancestor in the file."""
        for end in range(len(path), -1, -1):
            found = self._lines.get(tuple(path[:end]))
            if found is not None:
                return found
        return None


def _walk(node: yaml.Node, path: tuple[Hashable, ...], lines: dict[tuple[Hashable, ...], int]) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                lines[(*path, key.value)] = key.start_mark.line + 1
                _walk(value, (*path, key.value), lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk(item, (*path, index), lines)
