"""The checks of the contract, shared by the SDK (before anything leaves the process),
the proxy and the broker (on whatever arrives), so all three apply the same rules.

A failed check is an ``Invalid`` carrying the wire status it is answered with; the
SDK turns it into its own typed error (``holdfast.sdk.statuses``). Every message
quotes at most a bounded prefix of the offending input (``quote``): a 3 MiB queue
URI is answered with a short typed error, not with itself.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from holdfast.proto import pb, status_name
from holdfast.proto.limits import Limits

GUID_BYTES = 16
"""A GUID is a 16-byte UUID (the SDK uses uuid7)."""

QUOTE_LIMIT = 64
"""Characters (or bytes) of an offending input an error message quotes at most."""

SCHEME = "hf"
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_URI = re.compile(rf"{SCHEME}://(?P<domain>{_NAME})/(?P<queue>{_NAME})")
_NAME_ONLY = re.compile(_NAME)

NAME_RULE = "1-128 letters, digits, '.', '_' or '-' starting with a letter or digit"
"""What a domain or queue name is, in the words error messages use."""


def is_name(text: str) -> bool:
    """Whether ``text`` is a domain (or queue) name as a queue URI spells it."""
    return _NAME_ONLY.fullmatch(text) is not None


class Invalid(ValueError):
    """Input the contract refuses, with the wire status that answers it."""

    def __init__(self, status: pb.Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class InvalidUri(Invalid):
    """A queue URI that is not ``hf://<domain>/<queue>`` (answered INVALID_ARGUMENT)."""

    def __init__(self, message: str) -> None:
        super().__init__(pb.STATUS_INVALID_ARGUMENT, message)


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)``, cut after ``limit`` characters (bytes) of the value with a note
    of its full length, so an error message never grows with its input."""
    if isinstance(value, str | bytes | bytearray):
        if len(value) <= limit:
            return repr(value)
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}... ({len(value)} {unit})"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({type(value).__name__})"


class QueueUri(NamedTuple):
    """A parsed queue URI."""

    domain: str
    queue: str

    def __str__(self) -> str:
        return f"{SCHEME}://{self.domain}/{self.queue}"


def parse_queue_uri(uri: object) -> QueueUri:
    """Parse ``hf://<domain>/<queue>``; raise ``InvalidUri`` (INVALID_ARGUMENT) saying
    what is wrong. Domain and queue names are 1-128 characters of letters, digits,
    ``.``, ``_`` and ``-``, starting with a letter or digit; nothing may follow them
    (not even a newline)."""
    if not isinstance(uri, str):
        raise InvalidUri(f"queue URI must be a string, not {type(uri).__name__}")
    return _parse_uri(uri)


@functools.lru_cache(maxsize=4096)
def _parse_uri(uri: str) -> QueueUri:
    # Cached: a request/reply message names the same few reply queues over and over,
    # and every hop parses them. Only valid URIs are kept (an error is not cached).
    match = _URI.fullmatch(uri)
    if match is None:
        raise InvalidUri(
            f"invalid queue URI {quote(uri)}: expected {SCHEME}://<domain>/<queue>, names "
            "of 1-128 letters, digits, '.', '_' or '-' starting with a letter or digit",
        )
    return QueueUri(match["domain"], match["queue"])


def check_open(uri: str, read: bool, write: bool) -> QueueUri:
    """Check an open request: a valid URI, and read, write or both. Raises ``Invalid``."""
    parsed = parse_queue_uri(uri)
    if not (read or write):
        raise Invalid(pb.STATUS_INVALID_ARGUMENT, "open a queue with read, write or both")
    return parsed


def properties_size(properties: Mapping[str, str]) -> int:
    """The size that counts against ``max_properties_bytes``: the UTF-8 bytes of every
    key and value. The one rule the SDK and the broker both apply."""
    return _utf8_size("".join(properties), "".join(properties.values()))


def _utf8_size(keys: str, values: str) -> int:
    """The UTF-8 bytes of ``keys`` and ``values``: every key and every value joined.
    UTF-8 is concatenative, so this is the sum over the parts, in two joins instead of
    two encodes a property (a third of a request's validation); ASCII text, the usual,
    is not encoded at all. ``UnicodeEncodeError`` for a lone surrogate."""
    if keys.isascii() and values.isascii():
        return len(keys) + len(values)
    return len(_encode(keys)) + len(_encode(values))


PICKUP_TTL = "x-ttl-ms"
"""Per-message property: milliseconds the message may wait for its *first* delivery;
past them the broker dead-letters it (reason ``expired``). Request/reply sets it to a
call's pickup timeout."""

DEAD_LETTER_NOTIFY = "x-dead-letter-notify"
"""Per-message property: a queue URI told when the message is dead-lettered (a notice
under ``dead_letter_notice_guid``): the request/reply caller's reply queue, so a
caller learns at once why its request will never be answered."""

MAX_PICKUP_TTL_MS = 10 * 365 * 86400 * 1000


def message_policy_problem(properties: Mapping[str, str]) -> str | None:
    """Why the per-message policy properties (``PICKUP_TTL``, ``DEAD_LETTER_NOTIFY``)
    are invalid, or ``None``."""
    ttl = properties.get(PICKUP_TTL)
    if ttl is not None and not (ttl.isdigit() and 0 < int(ttl) <= MAX_PICKUP_TTL_MS):
        return f"{PICKUP_TTL} must be a whole number of milliseconds > 0, got {quote(ttl, 32)}"
    notify = properties.get(DEAD_LETTER_NOTIFY)
    if notify is not None:
        try:
            parse_queue_uri(notify)
        except InvalidUri as error:
            return f"{DEAD_LETTER_NOTIFY}: {error.message}"
    return None


def properties_problem(properties: Mapping[str, str], limits: Limits) -> str | None:
    """Why ``properties`` (already ``str -> str``, as decoded from the wire) break
    ``limits`` or carry an invalid per-message policy, or ``None`` if they do not."""
    if len(properties) > limits.max_properties:
        return _too_many(len(properties), limits)
    problem = _too_big(properties_size(properties), limits)
    if problem is None and (PICKUP_TTL in properties or DEAD_LETTER_NOTIFY in properties):
        problem = message_policy_problem(properties)
    return problem


def _too_many(count: int, limits: Limits) -> str:
    return f"{count} properties, over the limit of {limits.max_properties}"


def _too_big(size: int, limits: Limits) -> str | None:
    if size > limits.max_properties_bytes:
        return f"properties of {size} bytes, over the limit of {limits.max_properties_bytes}"
    return None


def check_properties(properties: object, limits: Limits) -> tuple[dict[str, str], int]:
    """Check properties an application passed: a mapping of ``str`` to ``str`` that
    encodes as UTF-8, within ``limits``. Return a copy and its ``properties_size``;
    raise ``Invalid`` (INVALID_PROPERTIES) otherwise."""
    # A dict, the usual, skips the ABC's isinstance: 0.94 -> 0.73 us for four properties.
    if type(properties) is not dict and not isinstance(properties, Mapping):
        raise Invalid(
            pb.STATUS_INVALID_PROPERTIES,
            f"properties must be a mapping of str to str, not {type(properties).__name__}",
        )
    if len(properties) > limits.max_properties:
        raise Invalid(pb.STATUS_INVALID_PROPERTIES, _too_many(len(properties), limits))
    # dict() of a dict is a C copy; protobuf's map (a relayed PUT) is a Mapping only by
    # registration, so dict() would go through the pure-Python KeysView.
    copied = (
        dict(properties)
        if type(properties) is dict
        else {key: properties[key] for key in properties}
    )
    # Two joins: str.join refuses what is not a str (TypeError), str.encode a lone
    # surrogate (UnicodeEncodeError), and together they give the size; the slow checks
    # below only run to name what is wrong.
    try:
        size = _utf8_size("".join(copied), "".join(copied.values()))
    except TypeError:
        raise Invalid(pb.STATUS_INVALID_PROPERTIES, _not_str(copied)) from None
    except UnicodeEncodeError:
        raise Invalid(pb.STATUS_INVALID_PROPERTIES, _not_unicode(copied)) from None
    problem = _too_big(size, limits)
    if problem is None and (PICKUP_TTL in copied or DEAD_LETTER_NOTIFY in copied):
        problem = message_policy_problem(copied)
    if problem is not None:
        raise Invalid(pb.STATUS_INVALID_PROPERTIES, problem)
    return copied, size


_encode = str.encode


def _not_unicode(properties: Mapping[str, str]) -> str:
    for text in (*properties, *properties.values()):
        try:
            _encode(text)
        except UnicodeEncodeError:
            return f"properties must be valid Unicode: {quote(text)} has a lone surrogate"
    return "properties must be valid Unicode"


def _not_str(properties: Mapping[object, object]) -> str:
    for key, value in properties.items():
        if not isinstance(key, str) or not isinstance(value, str):
            return (
                f"property {quote(key)} must map str to str, not "
                f"{type(key).__name__} to {type(value).__name__}"
            )
    return "properties must map str to str"


def check_payload(payload: bytes, limits: Limits) -> None:
    """Raise ``Invalid`` (PAYLOAD_TOO_LARGE) if ``payload`` is over the limit."""
    if len(payload) > limits.max_payload_bytes:
        raise Invalid(
            pb.STATUS_PAYLOAD_TOO_LARGE,
            f"payload of {len(payload)} bytes is over the limit of "
            f"{limits.max_payload_bytes} bytes",
        )


_OK = pb.STATUS_OK


def put_status(
    guid: bytes, payload: bytes, properties: Mapping[str, str], limits: Limits
) -> pb.Status:
    """The status a PUT that arrived on the wire is refused with, or ``STATUS_OK`` if
    its GUID, payload and properties are valid. Runs once per PUT on the broker's hot
    path, hence a status rather than an exception."""
    if len(guid) != GUID_BYTES:
        return pb.STATUS_INVALID_GUID
    if len(payload) > limits.max_payload_bytes:
        return pb.STATUS_PAYLOAD_TOO_LARGE
    if properties and properties_problem(properties, limits) is not None:
        return pb.STATUS_INVALID_PROPERTIES
    return _OK


ACK_STATUSES = frozenset(
    (
        _OK,
        # Refusals of the PUT itself (the broker's, or a proxy's that refuses it first).
        pb.STATUS_INVALID_ARGUMENT,
        pb.STATUS_INVALID_GUID,
        pb.STATUS_PAYLOAD_TOO_LARGE,
        pb.STATUS_INVALID_PROPERTIES,
        pb.STATUS_NOT_WRITABLE,
        pb.STATUS_UNKNOWN_QUEUE,
        pb.STATUS_PERMISSION_DENIED,
        pb.STATUS_CONFLICT,
        pb.STATUS_STORE_ERROR,
        pb.STATUS_SHUTTING_DOWN,
        # No outcome known, or none yet (push-backs: the client keeps the PUT).
        pb.STATUS_UNKNOWN,
        pb.STATUS_TOO_OLD,
        pb.STATUS_HISTORY_FULL,
        pb.STATUS_QUEUE_FULL,
        pb.STATUS_LIMIT_EXCEEDED,
    )
)
"""The statuses an ACK may carry: a PUT's outcomes and push-backs. The rest answer
other frames (``UNSPECIFIED`` answers none), and a byte that is no ``Status`` at all
is not a status: an ACK batch with one is malformed (``ack_statuses_problem``)."""

_ACK_STATUS_BYTES = bytes(sorted(ACK_STATUSES))


def ack_statuses_problem(statuses: bytes, count: int) -> str | None:
    """What is wrong with the statuses column of an ACK batch of ``count`` ACKs (not
    one byte each, or a byte not in ``ACK_STATUSES``), or None. The column is checked
    whole, in C (deleting every valid byte leaves nothing): no Python step per ACK."""
    if len(statuses) != count:
        return f"an ACK batch of {count} messages with {len(statuses)} statuses"
    if not statuses.translate(None, _ACK_STATUS_BYTES):
        return None
    # The error path only: find the first offending ACK to name it.
    index = next(i for i, status in enumerate(statuses) if status not in ACK_STATUSES)
    status = statuses[index]
    return (
        f"an ACK batch whose ACK {index} of {count} has status {status_name(status)} "
        f"({status}), which no ACK carries"
    )


def ack_queue_ids_problem(queue_ids: Sequence[int], count: int, chosen: int) -> str | None:
    """What is wrong with the queue_ids column of an ACK batch of ``count`` ACKs sent to
    a client whose handles are 1 to ``chosen`` (handles are the client's to choose):
    neither one per ACK nor one for all, or a handle the client never chose; or None.
    Checked whole (``min``/``max`` in C): no Python step per ACK."""
    size = len(queue_ids)
    if size != count and size != 1:
        return f"an ACK batch of {count} messages with {size} queue_ids"
    if not size:
        return None
    low, high = (queue_ids[0], queue_ids[0]) if size == 1 else (min(queue_ids), max(queue_ids))
    if low >= 1 and high <= chosen:
        return None
    handle = low if low < 1 else high
    return f"an ACK batch naming queue handle {handle}, which this client never opened"


def pushes_problem(
    queue_ids: Sequence[int], guids: Sequence[bytes], counts: list[int]
) -> str | None:
    """What breaks the PUSH rules in a PUSH batch whose columns agree (one value per
    PUSH each), or None: a delivery count of 0 (1 on first delivery), or one message
    (queue handle and GUID) twice, which would reach the application twice and be
    confirmed twice. A GUID may be in two queues (dedup is per queue): pairs are
    compared only when the GUIDs alone are not distinct. ``counts`` is a list: ``in``
    on a protobuf column costs ten times as much."""
    count = len(guids)
    if 0 in counts:
        return f"a PUSH batch whose PUSH {counts.index(0)} of {count} has delivery count 0"
    if count < 2 or len(set(guids)) == count:
        return None
    if len(set(zip(queue_ids, guids, strict=True))) != count:
        return f"a PUSH batch of {count} messages that carries one message twice"
    return None
