"""Small helpers for the broker tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from holdfast.proto import pb
from tests.support.columns import AckView
from tests.support.wire_client import WireClient


def unique_uri(name: str) -> str:
    """A queue URI no other test uses."""
    return f"hf://test/{name}-{uuid.uuid4().hex[:10]}"


def new_guid() -> bytes:
    """A fresh 16-byte GUID."""
    return uuid.uuid4().bytes


@contextmanager
def connected(address: str) -> Iterator[WireClient]:
    """A WireClient that has said hello; closed on exit."""
    client = WireClient(address)
    try:
        client.hello()
        yield client
    finally:
        client.close()


def options(messages: int = 1000, size: int = 32 * 1024 * 1024) -> pb.QueueOptions:
    """QueueOptions with the given unconfirmed-message and -byte limits."""
    return pb.QueueOptions(max_unconfirmed_messages=messages, max_unconfirmed_bytes=size)


def statuses(acks: list[AckView]) -> list[str]:
    """The status names of ``acks``, in order."""
    return [pb.Status.Name(ack.status) for ack in acks]
