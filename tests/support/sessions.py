"""Sessions for integration tests: fast failure detection, unique queues, draining."""

from __future__ import annotations

import time
import uuid
from collections import Counter

from holdfast.sdk import (
    HoldfastError,
    Message,
    QueueOptions,
    ReconnectOptions,
    Session,
    SessionOptions,
)
from holdfast.sdk.admin import AdminClient
from tests.support.recorder import MessageRecorder
from tests.support.waiting import wait_until

FAST = SessionOptions(
    keepalive_time=0.5,
    keepalive_timeout=1.0,
    connect_timeout=2.0,
    reconnect=ReconnectOptions(initial=0.02, maximum=0.2),
    close_timeout=5.0,
)
"""Session options for tests: a dead link is noticed in about a second, and
reconnects are retried every 20-200 ms."""


def unique_uri(name: str) -> str:
    """A queue URI no other test uses."""
    return f"hf://test/{name}-{uuid.uuid4().hex[:8]}"


def drain_messages(address: str, uri: str, expected: int, timeout: float = 60.0) -> list[Message]:
    """Consume and confirm until ``expected`` messages arrived and the queue stays quiet
    for half a second (so a duplicate right behind them would be seen); return them all."""
    received = MessageRecorder()
    with Session(address, options=FAST) as session:
        session.open_queue(
            uri,
            read=True,
            on_message=received,
            options=QueueOptions(max_unconfirmed_messages=5000),
        )
        try:
            wait_until(lambda: len(received) >= expected, timeout, f"{expected} messages")
        except AssertionError as error:
            arrived = f"{len(received)} arrived ({len(received.guids())} distinct)"
            raise AssertionError(f"{error}: {arrived}; {_queue_figures(address, uri)}") from None
        settle = time.monotonic() + 0.5
        last = len(received)
        while time.monotonic() < settle:
            time.sleep(0.05)  # polling a bounded quiet period, not waiting for an event
            if len(received) != last:
                last, settle = len(received), time.monotonic() + 0.5
    with received.lock:
        return list(received.messages)


def _queue_figures(address: str, uri: str) -> str:
    """What the broker holds of ``uri`` now, for a drain that timed out: messages
    still ready or unconfirmed there mean delivery stalled; none, with fewer arrived
    than were ACKed, mean they were lost."""
    try:
        with AdminClient(address, timeout=5.0) as admin:
            info = admin.stats(uri)
    except HoldfastError as error:  # a proxy's address, or the broker is gone
        return f"the broker's figures are not to be had: {error}"
    return (
        f"the broker holds {info.ready} ready and {info.unconfirmed} unconfirmed, "
        f"accepted {info.accepted}, redelivered {info.redelivered}"
    )


def drain(address: str, uri: str, expected: int, timeout: float = 60.0) -> Counter[uuid.UUID]:
    """``drain_messages``, counted by GUID."""
    return Counter(m.guid for m in drain_messages(address, uri, expected, timeout))
