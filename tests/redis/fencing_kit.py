"""What the fencing tests watch: consumers that record when they got each message,
and the events their sessions heard, on one clock."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from holdfast.sdk import Message, SessionEvent
from tests.support.toxics import link_address


class Deliveries:
    """An ``on_message`` that records (GUID, time) and confirms unless told to hold."""

    def __init__(self, hold: bool = False) -> None:
        self.hold = hold
        self.seen: list[tuple[uuid.UUID, float]] = []
        self.held: list[Message] = []
        self._lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        with self._lock:
            self.seen.append((message.guid, time.monotonic()))
            if self.hold:
                self.held.append(message)
        if not self.hold:
            message.confirm()

    def guids(self) -> list[uuid.UUID]:
        """GUIDs received, in order."""
        with self._lock:
            return [guid for guid, _ in self.seen]

    def first_seen(self) -> dict[uuid.UUID, float]:
        """When each GUID first arrived."""
        with self._lock:
            first: dict[uuid.UUID, float] = {}
            for guid, at in self.seen:
                first.setdefault(guid, at)
            return first

    def count(self) -> int:
        """How many deliveries arrived."""
        with self._lock:
            return len(self.seen)


class Events:
    """An ``on_event`` that keeps (event, time)."""

    def __init__(self) -> None:
        self.events: list[tuple[SessionEvent, float]] = []
        self._lock = threading.Lock()

    def __call__(self, event: SessionEvent) -> None:
        with self._lock:
            self.events.append((event, time.monotonic()))

    def of(self, kind: type[SessionEvent]) -> list[tuple[SessionEvent, float]]:
        """The events of one kind, with their times."""
        with self._lock:
            return [(e, at) for e, at in self.events if isinstance(e, kind)]


def redis_url_through(link: Any) -> str:
    """The ``--store`` value that reaches Redis through ``link`` (a link of the session's
    Toxiproxy server: ``toxic_link``). A second server is not started here: the
    Toxiproxy client keeps its server's address in a class attribute, so one would
    take over every client of the worker process (the faults tests' too)."""
    return f"redis://{link_address(link)}"


__all__ = ["Deliveries", "Events", "redis_url_through"]
