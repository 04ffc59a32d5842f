"""The source's columns: one row per message, named as in Spark's Kafka source.

``key`` (string: the message's ``x-key`` property, which the writer sets from its
``keyColumn``; null without one), ``value`` (binary: the payload), ``properties``
(map<string,string>), ``queue`` (its URI), ``guid`` (string), ``timestamp`` (when the
broker accepted it) and ``deliveryCount`` (1 on first delivery).
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Mapping

SOURCE_SCHEMA = (
    "key STRING, value BINARY, properties MAP<STRING, STRING>, queue STRING, guid STRING, "
    "timestamp TIMESTAMP, deliveryCount INT"
)
"""The rows ``spark.read``/``spark.readStream`` ``.format("holdfast")`` produce."""

KEY_PROPERTY = "x-key"
"""The message property the ``key`` column reads (the writer sets it from ``keyColumn``)."""

SourceRow = tuple[str | None, bytes, dict[str, str], str, str, datetime.datetime, int]
"""``(key, value, properties, queue, guid, timestamp, deliveryCount)``."""


def source_row(
    guid: uuid.UUID | bytes,
    payload: bytes,
    properties: Mapping[str, str],
    queue_uri: str,
    accepted_at: float,
    delivery_count: int,
) -> SourceRow:
    """The row of one message; ``accepted_at`` in seconds since the epoch."""
    text = str(guid if isinstance(guid, uuid.UUID) else uuid.UUID(bytes=guid))
    return (
        properties.get(KEY_PROPERTY),
        payload,
        dict(properties),
        queue_uri,
        text,
        datetime.datetime.fromtimestamp(accepted_at, tz=datetime.UTC),
        delivery_count,
    )
