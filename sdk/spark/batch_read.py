"""``spark.read.format("holdfast")``: a queue read as a batch DataFrame.

By default the read **peeks**: it pages through the queue's ready messages with the
broker's admin ``Peek`` call and leaves them in place (so ``address`` must name a broker,
which serves that call, not a proxy; with ``--auth-file`` the token needs ``admin``).
Pages are read one after the other, so a consumer working on the queue meanwhile may
move messages between pages: a peek is a look, not a snapshot.

With ``.option("consume", "true")`` the read takes the messages off the queue through
an ordinary consumer session (a proxy will do): every message the broker accepted before
the read started, in chunks of up to ``maxRowsPerBatch``; a chunk's messages are
confirmed once the task has handed all of them to Spark, so a task that dies earlier
leaves them to be redelivered. A reconnect during the read (a proxy or broker restart)
neither fails the task nor gives a row twice: the messages redelivered after it that
the task has handed already are confirmed, not read again (``_Inbox``). A job that
fails after its read task has finished does not put them back (at most once for the
job): ``readStream`` with ``walPath`` is the exactly-once way to consume.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import uuid
from collections.abc import Iterator, Sequence

from pyspark.sql.datasource import DataSourceReader, InputPartition

from holdfast.sdk.admin import AdminClient
from holdfast.sdk.errors import ConfirmDroppedError
from holdfast.sdk.failover import parse_addresses
from holdfast.sdk.options import QueueOptions, default_address
from holdfast.sdk.session import Session
from holdfast.sdk.spark.columns import SourceRow, source_row
from holdfast.sdk.spark.options import ReadOptions
from holdfast.sdk.spark.source import BACKLOG_QUIET, message_row
from holdfast.sdk.spark.walindex import GuidIndex
from holdfast.sdk.types import Message

PEEK_PAGE = 1000
"""Messages per ``Peek`` call (the broker's most)."""


class QueuePartition(InputPartition):
    """The whole queue, read by one task."""

    def __init__(self) -> None:
        super().__init__(0)


class QueueBatchReader(DataSourceReader):
    """The batch reader (see the module docstring)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        """One partition: a queue has one order."""
        return [QueuePartition()]

    def read(self, partition: InputPartition) -> Iterator[SourceRow]:
        """The queue's messages (on an executor)."""
        if self.options.consume:
            yield from _consume(self.options)
        else:
            yield from _peek(self.options)


def _peek(options: ReadOptions) -> Iterator[SourceRow]:
    address = parse_addresses(options.address or default_address())[0]
    with AdminClient(address, timeout=options.open_timeout) as admin:
        skip = 0
        while True:
            page = admin.peek(options.uri, PEEK_PAGE, skip)
            now = time.time()
            for message in page:
                yield source_row(
                    message.guid,
                    message.payload,
                    message.properties,
                    options.uri,
                    now - message.age,
                    message.delivery_count,
                )
            if len(page) < PEEK_PAGE:
                return
            skip += len(page)


class _Inbox:
    """Messages PUSHed to the read's session, accepted before ``cutoff``.

    A message is ``waiting`` (not yet in a chunk), then ``handed`` (its row is in the
    chunk being handed to Spark), then confirmed; a handed message whose CONFIRM was
    dropped (its connection is gone) is ``owed`` until its redelivery comes. After a
    reconnect the broker redelivers whatever the connection before left unconfirmed
    (or whose CONFIRM it never got): a newer delivery takes a waiting or handed one's
    place (only the newest can be confirmed), and a redelivery of a row already handed
    is confirmed on arrival, never read again. The GUIDs handed are kept in a
    ``GuidIndex`` on local disk, so a task's memory does not grow with its rows.
    """

    def __init__(self, cutoff: float) -> None:
        self.cutoff = cutoff
        self.arrival = threading.Condition()
        self.waiting: dict[uuid.UUID, Message] = {}
        self.handed: dict[uuid.UUID, Message] = {}
        self.owed: set[uuid.UUID] = set()
        self.index = GuidIndex()
        self.chunks = 0
        self.last = time.monotonic()

    def __call__(self, message: Message) -> None:
        if message.accepted_at > self.cutoff:
            return  # came after the read started: left unconfirmed, so redelivered
        guid = message.guid
        # Confirms happen under the lock too, so a redelivery and the CONFIRM of the
        # delivery before it are never interleaved.
        with self.arrival:
            if guid in self.handed:
                self.handed[guid] = message
            elif message.delivery_count > 1 and self.index.batch_of(guid) is not None:
                self._settle(message)
            else:
                self.waiting[guid] = message
                self.last = time.monotonic()
            self.arrival.notify_all()

    def take(self, most: int, deadline: float) -> list[Message]:
        """Up to ``most`` messages once that many came, or none came for
        ``BACKLOG_QUIET`` seconds (and no owed CONFIRM waits for its redelivery), or
        ``deadline`` passed. The messages taken are handed until ``confirm_handed``."""
        with self.arrival:
            while True:
                now = time.monotonic()
                quiet = now >= self.last + BACKLOG_QUIET and not self.owed
                if len(self.waiting) >= most or quiet or now >= deadline:
                    taken = list(itertools.islice(self.waiting.values(), most))
                    for message in taken:
                        del self.waiting[message.guid]
                        self.handed[message.guid] = message
                    self.chunks += 1
                    self.index.add(self.chunks, self.chunks, self.handed)
                    return taken
                wake = deadline if self.owed else min(self.last + BACKLOG_QUIET, deadline)
                self.arrival.wait(wake - now)

    def confirm_handed(self) -> None:
        """Confirm the newest delivery of each handed message (its row is with Spark)."""
        with self.arrival:
            for message in self.handed.values():
                self._settle(message)
            self.handed.clear()

    def close(self) -> None:
        """Remove the index of handed GUIDs."""
        self.index.close()

    def _settle(self, message: Message) -> None:
        try:
            message.confirm()
        except ConfirmDroppedError:
            self.owed.add(message.guid)  # the broker redelivers it: confirmed then
        else:
            self.owed.discard(message.guid)


def _consume(options: ReadOptions) -> Iterator[SourceRow]:
    inbox = _Inbox(time.time())
    most = options.max_rows_per_batch
    with contextlib.closing(inbox), Session(options.address) as session:
        session.open_queue(
            options.uri,
            read=True,
            on_message=inbox,
            options=QueueOptions(max_unconfirmed_messages=max(most, 1)),
            timeout=options.open_timeout,
        )
        while True:
            # A chunk comes within openTimeout, or the queue has nothing more for us.
            chunk = inbox.take(most, time.monotonic() + options.open_timeout)
            if not chunk:
                return
            yield from (message_row(message) for message in chunk)
            inbox.confirm_handed()
