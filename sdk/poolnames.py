"""How a keyed worker pool's queues are named (``holdfast.sdk.pool`` has the rest).

A pool is ``hf://<domain>/<pool>``. A request for key ``k`` goes to the key's own
request queue, ``hf://<domain>/<pool>.key-<hash>``, where ``<hash>`` is 32 hex
characters of the SHA-256 of the key: a key is data, never part of a path or a shell
word, so any UTF-8 string of 1 to ``MAX_KEY_BYTES`` bytes (without NUL, which an
environment variable cannot carry) is a key. Kept apart from ``pool`` so that the
request/reply caller can route by key without importing the worker side.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from holdfast.proto.uri import parse_queue_uri
from holdfast.proto.validate import Invalid
from holdfast.sdk.errors import InvalidArgumentError
from holdfast.sdk.statuses import invalid_error

MAX_KEY_BYTES = 256
"""The longest key, in UTF-8 bytes."""

KEY_HASH_CHARS = 32
"""Hex characters of the key's SHA-256 in its queue name."""

ACTIVITY_EVENT = "x-pool-event"
ACTIVITY_KEY = "x-pool-key"
ACTIVITY_WORKER = "x-pool-worker"
"""Properties of an activity report (``started`` or ``request-received``)."""

ACTIVITY_ALIVE_MS = "x-pool-alive-ms"
"""On a ``started`` report: the worker reports ``alive`` every that many ms."""

STARTED = "started"
REQUEST_RECEIVED = "request-received"
ALIVE = "alive"
"""A worker's heartbeat: it runs (not frozen). Sent only with a processing timeout;
it tells the manager the worker lives, and never keeps its key from going idle."""

ALIVE_MAX_INTERVAL = 5.0
"""The longest interval, in seconds, between two ``alive`` reports."""


def alive_interval(processing_timeout: float) -> float:
    """Seconds between a worker's ``alive`` reports under ``processing_timeout``: a
    quarter of it (at most ``ALIVE_MAX_INTERVAL``), so that the manager, which replaces
    a worker silent for longer than the timeout, sees several of them first."""
    return min(processing_timeout / 4, ALIVE_MAX_INTERVAL)


PROCESSING_TIMEOUT = "WORKER_PROCESSING_TIMEOUT"
"""Seconds a worker may spend on one request (set when the pool has
``--processing-timeout``); ``serve`` enforces it."""

LIFELINE_FD = "WORKER_LIFELINE_FD"
"""The file descriptor of the read end of a pipe whose write end only the worker's
manager holds (the ``subprocess`` driver sets it): ``serve`` ends the worker when it
reads end-of-file there, that is once the manager is gone, however it died."""

MANAGER_GONE_EXIT = 70
"""The exit status of a worker that ended because its manager was gone."""

PROCESSING_TIMEOUT_EXIT = 75
"""The exit status of a worker that ran a request past its processing timeout
(``EX_TEMPFAIL``): the manager replaces it at once, and counts it."""

_RESERVED = re.compile(r"\.key-|\.(orphans|poison|activity|manager)$")
"""What a pool's name may not hold: another pool's queue names end that way
(``hf://d/sim.key-zz`` would be matched by pool ``sim``'s key template)."""

ENVIRONMENT = ("WORKER_ID", "WORKER_KEY", "WORKER_POOL", "WORKER_REQUESTS_QUEUE")
"""What a worker process of a pool finds in its environment."""


@dataclass(frozen=True, slots=True)
class PoolNames:
    """The queues of one pool, ``hf://<domain>/<pool>``."""

    domain: str
    pool: str

    @classmethod
    def of(cls, uri: str) -> PoolNames:
        """Parse a pool URI; ``InvalidArgumentError`` if it cannot name a pool."""
        try:
            parsed = parse_queue_uri(uri)
        except Invalid as error:
            raise invalid_error(error) from None
        longest = 128 - len(".key-") - KEY_HASH_CHARS
        if len(parsed.queue) > longest:
            raise InvalidArgumentError(
                f"pool name {parsed.queue[:40]!r}... is over {longest} characters: "
                "its key queues' names would not fit"
            )
        reserved = _RESERVED.search(parsed.queue)
        if reserved is not None:
            raise InvalidArgumentError(
                f"pool name {parsed.queue[:80]!r} holds {reserved.group(0)!r}, which names "
                "another pool's queues (its key queues, orphans, poison, activity or "
                "manager queue): the two pools would share them"
            )
        return cls(parsed.domain, parsed.queue)

    @property
    def uri(self) -> str:
        """``hf://<domain>/<pool>``."""
        return f"hf://{self.domain}/{self.pool}"

    def _queue(self, suffix: str) -> str:
        return f"hf://{self.domain}/{self.pool}.{suffix}"

    def key_queue(self, key: str) -> str:
        """The request queue of ``key``."""
        digest = hashlib.sha256(check_key(key).encode("utf-8")).hexdigest()
        return self._queue(f"key-{digest[:KEY_HASH_CHARS]}")

    @property
    def key_queue_prefix(self) -> str:
        """What the URI of every key queue of the pool starts with."""
        return self._queue("key-")

    @property
    def key_template(self) -> str:
        """The policy template covering every key queue of the pool."""
        return self._queue("key-*")

    @property
    def orphans(self) -> str:
        """Where the broker redirects requests for keys without a bound queue."""
        return self._queue("orphans")

    @property
    def poison(self) -> str:
        """Where requests that kept crashing workers end (the dead-letter queue)."""
        return self._queue("poison")

    @property
    def activity(self) -> str:
        """Where workers report ``started`` and ``request-received``."""
        return self._queue("activity")

    @property
    def lock(self) -> str:
        """The queue whose one token makes a manager the active one."""
        return self._queue("manager")


def check_key(key: object) -> str:
    """Return ``key`` if it can be a pool key, else raise ``InvalidArgumentError``."""
    if not isinstance(key, str):
        raise InvalidArgumentError(f"a pool key must be a str, not {type(key).__name__}")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgumentError(
            "a pool key must be valid Unicode (no lone surrogates)"
        ) from None
    if not 1 <= size <= MAX_KEY_BYTES or "\0" in key:
        raise InvalidArgumentError(
            f"a pool key must be 1-{MAX_KEY_BYTES} UTF-8 bytes without NUL, got {size} bytes"
        )
    return key


def key_queue_uri(pool_uri: str, key: str) -> str:
    """The request queue of ``key`` in the pool ``pool_uri``."""
    return PoolNames.of(pool_uri).key_queue(key)


__all__ = [
    "ACTIVITY_ALIVE_MS",
    "ACTIVITY_EVENT",
    "ACTIVITY_KEY",
    "ACTIVITY_WORKER",
    "ALIVE",
    "ALIVE_MAX_INTERVAL",
    "ENVIRONMENT",
    "KEY_HASH_CHARS",
    "LIFELINE_FD",
    "MANAGER_GONE_EXIT",
    "MAX_KEY_BYTES",
    "PROCESSING_TIMEOUT",
    "PROCESSING_TIMEOUT_EXIT",
    "REQUEST_RECEIVED",
    "STARTED",
    "PoolNames",
    "alive_interval",
    "check_key",
    "key_queue_uri",
]
