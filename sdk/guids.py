"""uuid7 GUIDs for PUTs (RFC 9562), cheap enough for the ``post()`` hot path.

Layout of each GUID::

    48 bits  unix_ts_ms   milliseconds since the epoch (the real time: see below)
     4 bits  version      7
    12 bits  rand_a       a counter (RFC 9562 section 6.2, method 1), restarted at a
                          random value below 2048 every millisecond
     2 bits  variant      0b10
    62 bits  rand_b       random, fresh for every GUID

GUIDs of one source are strictly increasing in the order they are made, so a
session's GUIDs sort in post order; if the clock steps back they keep the last
millisecond, and only after 2048+ GUIDs in one millisecond does the timestamp
borrow the next one.

Why not ``uuid6.uuid7()``: it costs about 2 us, most of it one ``os.urandom``
call per GUID, and to stay monotonic it adds 1 ms to the timestamp for every GUID
made within the same millisecond, so a producer posting 100k messages a second
pushes its GUIDs' timestamps ~100 s into the future every second. Here the
randomness is read 4 KiB at a time (about 0.5 us per GUID in all), and the
counter keeps the timestamp true.

A source is not thread-safe (each engine owns one and its shell serialises
calls). After ``fork()`` every source starts afresh in the child, so parent and
child never draw from the same random pool.
"""

from __future__ import annotations

import os
import struct
import time
import uuid
import weakref

from holdfast.sdk.types import Ack, AckStatus

_POOL_WORDS = 512
"""Random 64-bit words read from the OS at a time."""

_RAND_B_MASK = (1 << 62) - 1
_VERSION_AND_VARIANT = (0x7 << 76) | (0b10 << 62)
_COUNTER_MAX = 0xFFF
_COUNTER_START_MASK = 0x7FF
"""A fresh millisecond's counter starts below 2048, leaving room for 2048+ increments."""

_sources: weakref.WeakSet[Uuid7Source] = weakref.WeakSet()


def _reset_all_after_fork() -> None:
    for source in list(_sources):
        source.reset()


os.register_at_fork(after_in_child=_reset_all_after_fork)

_new_uuid = object.__new__
_UUID = uuid.UUID
_SAFE_UNKNOWN = uuid.SafeUUID.unknown
_slot_int = _UUID.__dict__["int"].__set__
_slot_is_safe = _UUID.__dict__["is_safe"].__set__


def uuid_from_int(value: int) -> uuid.UUID:
    """``uuid.UUID(int=value)`` for a value known to be a valid 128-bit int, without
    the constructor's argument checks (it is on the ACK path: one per message)."""
    result = _new_uuid(_UUID)
    _slot_int(result, value)
    _slot_is_safe(result, _SAFE_UNKNOWN)
    return result


def uuid_from_bytes(guid: bytes) -> uuid.UUID:
    """``uuid.UUID(bytes=guid)`` for exactly 16 bytes, without the argument checks."""
    result = _new_uuid(_UUID)
    _slot_int(result, int.from_bytes(guid))
    _slot_is_safe(result, _SAFE_UNKNOWN)
    return result


_slot_guid = Ack.__dict__["guid"].__set__
_slot_status = Ack.__dict__["status"].__set__
_slot_queue_uri = Ack.__dict__["queue_uri"].__set__


def ack_from_bytes(guid: bytes, status: AckStatus, queue_uri: str) -> Ack:
    """``Ack(uuid_from_bytes(guid), status, queue_uri)`` without the frozen dataclass's
    ``__init__`` (three ``object.__setattr__`` calls): one per ACKed message."""
    value = _new_uuid(_UUID)
    _slot_int(value, int.from_bytes(guid))
    _slot_is_safe(value, _SAFE_UNKNOWN)
    result = _new_uuid(Ack)
    _slot_guid(result, value)
    _slot_status(result, status)
    _slot_queue_uri(result, queue_uri)
    return result


class Uuid7Source:
    """Makes strictly increasing uuid7 GUIDs; see the module docstring."""

    def __init__(self) -> None:
        self._ms = 0
        self._counter = 0
        self._pool: tuple[int, ...] = ()
        self._next = 0
        _sources.add(self)

    def reset(self) -> None:
        """Forget the random pool and the counter (called in a forked child)."""
        self._pool = ()
        self._next = 0
        self._ms = 0
        self._counter = 0

    def _random(self) -> int:
        index = self._next
        if index >= len(self._pool):
            self._pool = struct.unpack(f">{_POOL_WORDS}Q", os.urandom(8 * _POOL_WORDS))
            index = 0
        self._next = index + 1
        return self._pool[index]

    def next(self) -> tuple[uuid.UUID, bytes]:
        """A new GUID, as a ``uuid.UUID`` and as its 16 bytes."""
        ms = time.time_ns() // 1_000_000
        if ms > self._ms:
            self._ms = ms
            counter = self._random() & _COUNTER_START_MASK
        else:
            ms = self._ms  # same millisecond, or the clock stepped back: stay monotonic
            counter = self._counter + 1
            if counter > _COUNTER_MAX:
                ms = self._ms = ms + 1
                counter = self._random() & _COUNTER_START_MASK
        self._counter = counter
        # Once per post: ``_random`` and ``uuid_from_int`` inlined (two calls less).
        index = self._next
        if index >= len(self._pool):
            self._pool = struct.unpack(f">{_POOL_WORDS}Q", os.urandom(8 * _POOL_WORDS))
            index = 0
        self._next = index + 1
        value = (
            (ms << 80) | _VERSION_AND_VARIANT | (counter << 64) | (self._pool[index] & _RAND_B_MASK)
        )
        made = _new_uuid(_UUID)
        _slot_int(made, value)
        _slot_is_safe(made, _SAFE_UNKNOWN)
        return made, value.to_bytes(16)
