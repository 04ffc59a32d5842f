"""One segment of the packed PUT buffer (``holdfast.sdk.putsegments`` tells the whole
story): the columns of consecutive PUTs, and reading one PUT back out of them."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

from holdfast.sdk.types import Ack

Extra = tuple[dict[str, str] | None, Callable[[Ack], Any] | None, int]
"""What few PUTs have: ``(properties, on_ack, bytes the properties add to the size)``."""


class Segment:
    """The columns of up to ``SEGMENT_PUTS`` consecutive PUTs (``ones``: a 1 for each)."""

    __slots__ = (
        "base",
        "data",
        "dead",
        "ends",
        "extras",
        "guids",
        "last",
        "live",
        "posted",
        "queue_ids",
        "strays",
    )

    def __init__(self, base: int, last: bytes, ones: bytes) -> None:
        self.base = base
        """The ``seq`` of the segment's first PUT."""
        self.guids: bytearray | bytes = bytearray()
        """16 bytes per PUT, sorted: a stray's place repeats the GUID before it."""
        self.last = last
        """The column's last GUID (the previous segment's while this one is empty)."""
        self.data: bytearray | bytes = bytearray()
        """The payloads end to end."""
        self.ends = array("Q")
        """Where each payload ends in ``data``."""
        self.posted = array("d")
        """Each PUT's post time on the engine's clock (see ``PendingPut``)."""
        self.queue_ids = array("I")
        self.live = bytearray(ones)
        """1 per PUT not reported yet, else 0 (made whole, so a post need not grow it)."""
        self.dead = 0
        """PUTs reported."""
        self.extras: dict[int, Extra] = {}
        """By index, the PUTs with properties or an ``on_ack``."""
        self.strays: dict[int, bytes] = {}
        """By index, the GUIDs that are not in the column (see the module docstring)."""

    def __len__(self) -> int:
        return len(self.ends)

    @property
    def alive(self) -> int:
        """PUTs not reported yet."""
        return len(self.ends) - self.dead

    def freeze(self) -> None:
        """The segment is full: give back what its growing buffers had reserved."""
        self.guids = bytes(self.guids)
        self.data = bytes(self.data)

    def guid(self, i: int) -> bytes:
        """The GUID of the PUT at index ``i``."""
        if self.strays:
            stray = self.strays.get(i)
            if stray is not None:
                return stray
        return bytes(self.guids[16 * i : 16 * i + 16])

    def payload(self, i: int) -> bytes | memoryview:
        """The payload of the PUT at index ``i``, to be sent: a view of a full segment's
        bytes, or a copy out of the tail's, which still grows (a view would pin it).
        Copies doubled a proxy's memory when it sent its whole buffer again after an
        outage (256 MiB by default, all taken at once)."""
        ends = self.ends
        view = memoryview(self.data)[ends[i - 1] if i else 0 : ends[i]]
        return view if self.data.__class__ is bytes else bytes(view)

    def size(self, i: int) -> int:
        """Wire bytes of the PUT at index ``i`` less ``PUT_OVERHEAD`` (payload, properties)."""
        ends = self.ends
        size = ends[i] - (ends[i - 1] if i else 0)
        if self.extras:
            extra = self.extras.get(i)
            if extra is not None:
                size += extra[2]
        return size

    def first_at_or_after(self, guid: bytes) -> int:
        """The first index whose column GUID is not below ``guid`` (``len`` if none)."""
        column = self.guids
        lo, hi = 0, len(self.ends)
        while lo < hi:
            mid = (lo + hi) >> 1
            if column[16 * mid : 16 * mid + 16] < guid:
                lo = mid + 1
            else:
                hi = mid
        return lo


__all__ = ["Extra", "Segment"]
