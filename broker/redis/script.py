"""A Lua script of the Redis store, and one call of it with its KEYS and ARGV laid out.

Each script module defines its scripts as ``Script`` values and, next to each, the one
function that builds its ``ScriptCall``: keyword-only parameters named after what the
Lua reads, put into KEYS and ARGV in the one order the Lua reads them. Every caller
goes through that function (``RedisClient.run`` takes only a ``ScriptCall``), so the
layout is written once in Python, next to the Lua that reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

Arg = bytes | str | int | float
"""One ARGV value as redis-py sends it (numbers go as their decimal text)."""


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua script, registered with a client under ``name`` (its log and error name)."""

    name: str
    lua: str

    def call(self, keys: Iterable[str], args: Iterable[Arg] = ()) -> ScriptCall:
        """A call of this script; for the script's own layout function only."""
        return ScriptCall(self, list(keys), list(args))


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One call of a script: KEYS and ARGV in the order its Lua reads them."""

    script: Script
    keys: list[str]
    args: list[Arg]


def rows(raw: Sequence[Any], width: int) -> Iterator[tuple[Any, ...]]:
    """A flat script reply read as rows of ``width`` values (``ValueError`` if it does
    not divide: a script and its reader that disagree fail loudly)."""
    values = iter(raw)
    return zip(*[values] * width, strict=True)


def text(raw: object) -> str:
    """A reply value as text (redis-py answers bytes)."""
    return raw.decode() if isinstance(raw, bytes) else str(raw)


__all__ = ["Arg", "Script", "ScriptCall", "rows", "text"]
