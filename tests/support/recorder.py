"""Thread-safe recorders for what a Session reports: ACKs, messages and events."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field

from holdfast.sdk import Ack, AckStatus, Message, SessionEvent


@dataclass
class AckRecorder:
    """Collects ACKs; ``epoch`` counts Reconnected events seen before each ACK."""

    acks: list[tuple[Ack, int]] = field(default_factory=list)
    epoch: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, ack: Ack) -> None:
        with self.lock:
            self.acks.append((ack, self.epoch))

    def per_guid(self) -> Counter[uuid.UUID]:
        """How many times each GUID was reported."""
        with self.lock:
            return Counter(ack.guid for ack, _ in self.acks)

    def with_status(self, status: AckStatus) -> set[uuid.UUID]:
        """GUIDs reported with ``status``."""
        with self.lock:
            return {ack.guid for ack, _ in self.acks if ack.status is status}

    def __len__(self) -> int:
        with self.lock:
            return len(self.acks)


@dataclass
class MessageRecorder:
    """Collects PUSHed messages, optionally confirming each one."""

    confirm: bool = True
    messages: list[Message] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, message: Message) -> None:
        with self.lock:
            self.messages.append(message)
        if self.confirm:
            message.confirm()

    def guids(self) -> Counter[uuid.UUID]:
        """How many times each GUID was delivered."""
        with self.lock:
            return Counter(m.guid for m in self.messages)

    def __len__(self) -> int:
        with self.lock:
            return len(self.messages)


@dataclass
class EventRecorder:
    """Collects session events in the order they were delivered."""

    events: list[SessionEvent] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, event: SessionEvent) -> None:
        with self.lock:
            self.events.append(event)

    def of(self, kind: type[SessionEvent]) -> list[SessionEvent]:
        """The events of one type, in order."""
        with self.lock:
            return [e for e in self.events if isinstance(e, kind)]

    def names(self) -> list[str]:
        """Event class names, in order."""
        with self.lock:
            return [type(e).__name__ for e in self.events]
