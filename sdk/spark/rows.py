"""How Spark rows become payloads, properties and the canonical bytes keys are hashed from."""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import json.encoder
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from pyspark.sql import Row

Record: TypeAlias = "Row | dict[str, Any]"
"""What a write task's loop reads: a Spark ``Row``, or the dict of one row's column
values that the Arrow writers read (``arrow.batch_records``); both index by column
name."""


def json_default(value: Any) -> Any:
    """``json.dumps(default=...)`` for the values PySpark rows hold besides JSON's own.

    Dates, times and timestamps as ISO 8601; ``Decimal`` as a string (a float would
    lose digits); binary as base64; a ``timedelta`` (day-time interval) as seconds.
    A given value always encodes the same way, which the content key relies on.
    """
    if isinstance(value, datetime.date | datetime.time):  # datetime is a date
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    as_dict = getattr(value, "asDict", None)  # a Row nested somewhere asDict did not reach
    if callable(as_dict):
        return as_dict(recursive=True)
    raise TypeError(
        f"cannot turn a {type(value).__name__} into JSON; give QueueSink a serializer "
        "(and a key_column if rows of this type are to be keyed)"
    )


def row_to_json(row: Row) -> bytes:
    """The default serializer: compact UTF-8 JSON of ``row.asDict(recursive=True)``,
    in column order."""
    return payload_json(row_values(row))


def one_shot(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode``, with CPython's C encoder made once instead of per call.

    ``JSONEncoder.encode`` builds a new C encoder (``c_make_encoder``) on every call,
    a third of its time for a two-column row; this makes it once, with the encoder's
    own settings, so the text is the same. It leaves out the check for circular
    containers (row values are never circular; one would end in ``RecursionError``
    instead of ``ValueError``). Without the C encoder (not CPython) it is ``encode``.
    """
    # Not in typeshed: CPython's private C accelerator of json.encoder.
    make: Callable[..., Any] | None = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has it
        return encoder.encode
    strings = (
        json.encoder.encode_basestring_ascii
        if encoder.ensure_ascii
        else json.encoder.encode_basestring
    )
    chunks = make(
        None,
        encoder.default,
        strings,
        None,
        encoder.key_separator,
        encoder.item_separator,
        encoder.sort_keys,
        encoder.skipkeys,
        encoder.allow_nan,
    )

    def encode(value: Any) -> str:
        return "".join(chunks(value, 0))

    return encode


# One encoder each, built once: ``json.dumps`` with arguments builds an encoder per call,
# which was a fifth of a task's time per row.
_PAYLOAD = one_shot(
    json.JSONEncoder(default=json_default, separators=(",", ":"), ensure_ascii=False)
)
_CANONICAL = one_shot(json.JSONEncoder(default=json_default, separators=(",", ":"), sort_keys=True))


def payload_json(values: Mapping[str, Any]) -> bytes:
    """Compact UTF-8 JSON of a row's values, in column order."""
    return _PAYLOAD(values).encode()


def canonical_json(value: Any) -> bytes:
    """The stable encoding the row keys are hashed from: sorted keys, no spaces, ASCII."""
    if type(value) is int:  # the usual key column: JSON of an int is its decimal form
        return str(value).encode()
    return _CANONICAL(value).encode()


_SCALARS = frozenset((int, float, str, bool, type(None)))


def row_values(row: Record) -> dict[str, Any]:
    """``row.asDict(recursive=True)``, without its per-value conversion when every value
    is a scalar (the usual flat row), which gives the same dict. A record that is a
    dict already (the Arrow writers', ``arrow.batch_records``) is its own values."""
    if isinstance(row, dict):
        return row
    fields = getattr(row, "__fields__", None)  # a Row made of values only has none
    values = tuple(row)
    if fields is not None and all(type(value) in _SCALARS for value in values):
        return dict(zip(fields, values, strict=True))
    return row.asDict(recursive=True)


def property_value(value: Any) -> str:
    """A column value as a message property (a string)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    return canonical_json(value).decode()
