"""Naming the field at fault in a validation error."""
from __future__ import annotations

from typing import Any


def field_path(loc: tuple[Any, ...]) -> str:
    """pydantic's error location as a dotted path: ('tenants', 0, 'api_keys') -> tenants[0].api_keys."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out
