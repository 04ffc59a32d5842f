"""Which GUID a moved message takes, and where a queue's dead letters may go: the
rules every store's dead-letter moves share (``deadletter`` for memory and sqlite,
``redis.graveyard`` and the ``ADD`` script of ``redis.move_scripts`` for Redis).

Dedup is per queue, so a dead-letter queue may already hold a dead letter's GUID
(another queue's dead letter, or a PUT of its own). Contract rule 9 leaves no room:
a dead letter is never in both queues and never in neither, and a CONFIRM by GUID
names one message. So the copy takes the first ``dead_letter_guid(origin, guid, n)``
(n = 1, 2, ...) the queue does not hold and keeps its GUID in ``x-original-guid``;
``dlq replay`` puts it back under that GUID, and leaves (and reports) a dead letter
whose original queue holds the GUID it would go back under.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from holdfast.broker.store import StoredMessage
from holdfast.proto.policy import ORIGINAL_GUID, dead_letter_guid

log = logging.getLogger(__name__)


def own_dead_letter(uri: str, dead_letter: str | None) -> str | None:
    """The dead-letter queue of the queue ``uri`` under a policy naming ``dead_letter``:
    None if it names the queue itself (refused when set; a store may hold such a
    policy from before). Moving a dead letter into its own queue replaced it by
    itself: its origin overwritten, and on sqlite the message lost."""
    if dead_letter == uri:
        log.error(
            "%s: its policy names it as its own dead-letter queue; its dead messages "
            "are dropped (counted) as without one: set another dead-letter queue",
            uri,
        )
        return None
    return dead_letter


def unique_copy(copy: StoredMessage, origin: str, holds: Callable[[bytes], bool]) -> StoredMessage:
    """``copy`` as it enters its queue: under its GUID if ``holds`` says the queue does
    not hold it, else under the first ``dead_letter_guid(origin, guid, n)`` it does not
    hold, with ``x-original-guid`` (the rule the Redis store's ``ADD`` applies too)."""
    if not holds(copy.guid):
        return copy
    attempt = 1
    while holds(guid := dead_letter_guid(origin, copy.guid, attempt)):
        attempt += 1
    return renamed(copy, guid)


def renamed(copy: StoredMessage, guid: bytes) -> StoredMessage:
    """``copy`` under ``guid``, its own GUID kept in ``x-original-guid``; one it has
    already (renamed by an earlier move, into the dead-letter queue it now leaves) is
    kept: that is the GUID it had in ``x-original-uri``, where a replay puts it."""
    first = copy.properties.get(ORIGINAL_GUID) or copy.guid.hex()
    return replace(copy, guid=guid, properties={**copy.properties, ORIGINAL_GUID: first})


def held_problem(message: StoredMessage, copy: StoredMessage) -> str:
    """Why a replay leaves ``message`` in its dead-letter queue: its original queue
    holds the GUID ``copy`` would go back under."""
    return (
        f"{message.guid.hex()}: {copy.queue_uri} holds a message under GUID "
        f"{copy.guid.hex()}; left in the dead-letter queue (replay it once that one is gone)"
    )


def original_guid(message: StoredMessage) -> bytes | None:
    """The GUID a dead letter goes back under: its ``x-original-guid`` (it was renamed
    in its dead-letter queue), else its own; None if that property is not a GUID."""
    text = message.properties.get(ORIGINAL_GUID)
    if text is None:
        return message.guid
    try:
        guid = bytes.fromhex(text)
    except ValueError:
        return None
    return guid if len(guid) == 16 else None


__all__ = ["held_problem", "original_guid", "own_dead_letter", "renamed", "unique_copy"]
