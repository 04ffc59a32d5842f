"""The wire of request/reply data streams, without I/O: what both front-ends share.

The threaded side (``holdfast.sdk.rpc.streams``, a thread per sender, blocking
readers) and the asyncio side (``holdfast.sdk.aio.streams``, tasks and awaited
readers) put the same chunks on the same queues through these: queue names, chunk
GUIDs and properties (``Outgoing``), and on the reading side the order, the
duplicates and the end or failure of a stream (``Incoming``); and the reader's
credits, which pace the sender to what the reader has read. Only waiting, for the
broker's ACKs, for credit or for the next chunk, is theirs. This module holds the
names, GUIDs and properties; ``holdfast.sdk.rpc.outgoing`` and
``holdfast.sdk.rpc.incoming`` the two sides' rules.

Credits: a sender may post at most ``CREDIT_WINDOW`` chunks beyond the last one the
reader has read, so a slow reader (or a worker that has not picked up the request
yet) holds the stream's memory in the broker to that window, whatever the size of
the stream. The reader says how far it has read with small messages on the
stream's credit queue (``credit_uri``): after every ``CREDIT_EVERY`` chunks read,
a message with ``CREDIT`` = the sequence number of the last chunk read, and, when
it stops before the end of the stream, one more with ``CREDIT_STOP`` too, so the
sender stops instead of waiting for credit for as long as its call lives (a
worker's reply stream, which no call bounds on the worker's side, gives up after
``REPLY_CREDIT_TIMEOUT`` without new credit). A
credit's GUID is derived from (request guid, stream name, sequence number) like a
chunk's, so a credit retransmitted after a reconnect is dropped by the broker's
dedup; the sender takes the highest it has seen, since credits may come twice or
out of order after a reconnect.

Leftovers: chunks nobody reads (a handler that ignores a stream or stops early)
would stay in the broker for good, their queue with it. A reader that stops before
the end tells the sender to stop, then drains its queue (``DRAIN_IDLE``): it confirms
what was delivered to it and not read, and what the sender posted before it stopped,
at most ``CREDIT_WINDOW`` chunks. A chunk given back instead would count as
delivered, which no pickup TTL expires. Credits carry the broker's pickup TTL
(``CREDIT_TTL``): the reader's last one often comes after its sender has ended (the
sender posts the end of a short stream before the reader has read it), and a stop
or a credit given after a killed or timed-out caller's sender ended reaches nobody;
unread, each kept its credit queue in the broker for good.

Rounds: a request whose worker was lost mid-stream is redelivered to another worker,
whose reader needs the stream from its start, but the chunks the lost reader
confirmed are gone from the broker. So a reader of a redelivered request asks for the
stream again: its first credit carries ``RESTART`` and ``EPOCH`` = the request's
delivery count less one, the round it reads. The caller's sender starts that round at
chunk 0 (a seekable source rewound to where the stream began, any other from the
copy it keeps of a stream's first ``CREDIT_WINDOW`` chunks) or, when it cannot, sends
the reader an ``ABORT`` in that round and fails the call with ``StreamError``. Chunks
and credits of a round carry ``EPOCH`` (none in round 0, so round 0 is the wire of
old), and their GUIDs name it, so no round's chunk is taken for another's replay. A
reader skips the chunks of earlier rounds and gives up (``StreamError``, the chunk
left to the newer reader) when it sees a later round's: another worker took the
request over.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from holdfast.sdk.errors import ConfirmDroppedError, InvalidArgumentError
from holdfast.sdk.rpc import wire
from holdfast.sdk.types import Message

CHUNK_SIZE = 256 * 1024
"""Bytes per chunk message."""
WINDOW = 8
"""Chunks in flight per stream: unacknowledged by the broker on the sender, unconfirmed
on the receiver."""
CREDIT_WINDOW = 16
"""Chunks a sender may post beyond the last one the reader has read (16 chunks: 4 MiB
per stream); this bounds what a stream holds in the broker."""
CREDIT_EVERY = CREDIT_WINDOW // 2
"""Chunks read between two credits: half the window, so the sender gets more credit
before it runs out of it."""
CREDIT_CLOSE_WAIT = 5.0
"""Seconds a reader that closes waits for the broker to take its last credits (only
while its link is down does it wait at all: the same bound as the SDK's
high-watermark wait)."""
REPLY_CREDIT_TIMEOUT = 300.0
"""Seconds a worker's reply stream waits for new credit before it gives up with
``StreamError``: a caller that never reads (or closes) a reply's stream would
otherwise keep the worker's sender waiting until the worker stops. A request's
stream needs no such bound: its sender ends with its call."""
CANCEL_POLL = 0.2
"""Seconds between a blocked threaded reader's looks at its request's cancel flag."""
STALL_TIMEOUT = 30.0
"""Seconds a reader waits for the next chunk before failing with ``StreamError``."""
CREDIT_TTL = 2 * STALL_TIMEOUT
"""Seconds a credit waits for its sender before the broker drops it (``x-ttl-ms``;
"Leftovers"). A sender that took none for that long has ended or is cut off for
longer than its reader's stall timeout, past which the stream failed anyway."""

DRAIN_IDLE = 0.2
"""Seconds without a chunk after which a reader that stopped early ends its drain."""

NAMES = "x-rpc-streams"
"""Request (or reply) property: the comma-separated names of its streams."""
TAKEN = "x-rpc-streams-taken"
"""Durable reply property, on the copy ``fetch_reply`` keeps of a reply with streams:
an earlier fetch took them (``holdfast.sdk.rpc.durable``)."""
STREAM = "x-rpc-stream"
"""Chunk property: the stream's name."""
SEQ = "x-rpc-seq"
"""Chunk property: the chunk's sequence number, from 0."""
END = "x-rpc-eos"
"""Chunk property: the stream ends here (an empty chunk)."""
ABORT = "x-rpc-stream-abort"
"""Chunk property: the sender failed (the type of its error; the payload says why)."""
CREDIT = "x-rpc-credit"
"""Credit property: the reader has read every chunk through this sequence number."""
CREDIT_STOP = "x-rpc-credit-stop"
"""Credit property: the reader stopped before the end; send nothing more."""
EPOCH = "x-rpc-epoch"
"""Chunk and credit property: the round (absent: 0). See "Rounds" above."""
RESTART = "x-rpc-restart"
"""Credit property: a new reader (its request was redelivered) wants the stream from
its start, in the round ``EPOCH``."""


class Readable(Protocol):
    """A stream's source on either API: a binary file-like object."""

    def read(self, size: int = -1, /) -> bytes:
        """Up to ``size`` bytes; ``b""`` at the end."""
        ...


_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NAMESPACE = b"holdfast-rpc-stream/1:"


def check_names(streams: Mapping[str, Any] | None) -> list[str]:
    """The stream names of ``streams``; ``InvalidArgumentError`` for a bad name, or for a
    source that is neither readable (``read(n)``) nor an async iterable: ``b"abc"`` or
    None was taken, the request sent and its handler run, before the stream failed."""
    names = list(streams or {})
    for name in names:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidArgumentError(
                f"stream name {str(name)[:80]!r} must be 1-64 of [A-Za-z0-9_.-]"
            )
        source = streams[name]  # type: ignore[index]
        if not callable(getattr(source, "read", None)) and not hasattr(source, "__aiter__"):
            raise InvalidArgumentError(
                f"stream {name!r} must be a readable (binary file, io.BytesIO) or an "
                f"async iterable of bytes, not {type(source).__name__}"
            )
    return names


def parse_names(properties: Mapping[str, str]) -> list[str]:
    """The stream names a request or reply announces (bad names are ignored)."""
    text = properties.get(NAMES, "")
    return [name for name in text.split(",") if _NAME.fullmatch(name)]


def announce(properties: dict[str, str], names: list[str]) -> dict[str, str]:
    """``properties`` naming the streams ``names`` (unchanged without streams)."""
    if names:
        properties[NAMES] = ",".join(names)
    return properties


def streaming_reply_properties(
    request_guid: uuid.UUID, user: Mapping[str, str], streams: Mapping[str, Any]
) -> dict[str, str]:
    """The properties of a reply with data streams (a handler's ``StreamingReply``)."""
    names = check_names(streams)
    return announce(wire.reply_properties(request_guid, wire.check_user_properties(user)), names)


def stream_uri(domain: str, request_guid: uuid.UUID, name: str) -> str:
    """The queue carrying stream ``name`` of the call ``request_guid`` (for a reply's
    streams, the reply GUID)."""
    return f"hf://{domain}/rpc-stream-{request_guid.hex}-{name}"


def credit_uri(domain: str, request_guid: uuid.UUID, name: str) -> str:
    """The queue on which the reader of stream ``name`` gives its sender credit (the
    ``rpc-credit-`` prefix cannot collide with any stream's queue name)."""
    return f"hf://{domain}/rpc-credit-{request_guid.hex}-{name}"


def _derived(request_guid: uuid.UUID, what: str) -> uuid.UUID:
    return uuid.uuid5(request_guid, (_NAMESPACE + what.encode()).hex())


def _round(epoch: int) -> str:
    # Round 0 names no round: its GUIDs are those of the wire before rounds.
    return f"e{epoch}/" if epoch else ""


def chunk_guid(request_guid: uuid.UUID, name: str, seq: int, epoch: int = 0) -> uuid.UUID:
    """The GUID of chunk ``seq`` of stream ``name`` in round ``epoch``: the same on every
    retransmit, another in every round."""
    return _derived(request_guid, f"{name}/{_round(epoch)}{seq}")


def credit_guid(
    request_guid: uuid.UUID, name: str, seq: int, stop: bool = False, epoch: int = 0
) -> uuid.UUID:
    """The GUID of the credit "read through ``seq``" of stream ``name`` in round
    ``epoch`` (``stop``: the reader's last one): the same on every retransmit, never a
    chunk's."""
    return _derived(request_guid, f"{name}/credit/{_round(epoch)}{seq}{'/stop' if stop else ''}")


def restart_guid(request_guid: uuid.UUID, name: str, epoch: int) -> uuid.UUID:
    """The GUID of the credit asking for stream ``name`` again in round ``epoch``."""
    return _derived(request_guid, f"{name}/restart/{epoch}")


def round_of(delivery_count: int) -> int:
    """The round a reader of a request delivered ``delivery_count`` times reads: 0 on
    the first delivery, one more on each redelivery."""
    return max(delivery_count - 1, 0)


def epoch_of(properties: Mapping[str, str]) -> int:
    """The round a chunk or credit belongs to (0 without ``EPOCH``; -1 if unreadable,
    which no round is)."""
    text = properties.get(EPOCH)
    if text is None:
        return 0
    try:
        epoch = int(text)
    except ValueError:
        return -1
    return epoch if epoch >= 0 else -1


@dataclass(frozen=True, slots=True)
class Chunk:
    """One message of a stream, as it is posted."""

    payload: bytes
    properties: dict[str, str]
    guid: uuid.UUID


def settle_unread(messages: Iterable[Message], epoch: int) -> None:
    """Confirm the chunks delivered to a reader that stopped early (of its round
    ``epoch`` or an earlier one; "Leftovers"). A later round's chunk is left for the
    reader of that round."""
    for message in messages:
        if 0 <= epoch_of(message.properties) <= epoch:
            confirm_chunk(message)


def confirm_chunk(message: Message) -> None:
    """Confirm a chunk the reader has taken (or a credit the sender has taken). A
    CONFIRM dropped with the link (or of a message delivered on an earlier
    connection) is fine: the chunk itself is read, and its redelivery is dropped as a
    duplicate by its sequence number (a credit's counts once, the highest winning)."""
    with contextlib.suppress(ConfirmDroppedError):
        message.confirm()
