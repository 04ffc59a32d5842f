"""Options of request/reply workers, as a small value object."""

from __future__ import annotations

from dataclasses import dataclass

from holdfast.sdk.errors import InvalidArgumentError


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How a ``Worker`` heartbeats, keeps replies and watches its callers."""

    heartbeat_interval: float = 1.0
    """Seconds between heartbeats of a running call; a caller presumes the worker
    lost after three intervals of silence."""
    first_beat_after: float = 0.1
    """Seconds a handler runs before its first heartbeat: a call answered sooner
    costs no heartbeat at all (the reply says it was picked up)."""
    reply_window: float = 300.0
    """Seconds a reply is kept by request GUID, to answer a redelivered request
    without running the handler again (match the broker's dedup window)."""
    max_replies: int = 100_000
    """Most replies kept at once (the oldest are forgotten first)."""
    caller_grace: float = 5.0
    """Seconds a caller's reply queue may have no consumer (its session
    reconnecting) before its running calls are cancelled."""
    stop_timeout: float = 30.0
    """Seconds ``Worker.close()`` lets running handlers finish."""
    extra_requests: int | None = None
    """Requests the broker may hand this worker beyond the ``concurrency`` it runs,
    waiting for a thread (default: ``concurrency``). They keep the threads busy while
    replies travel (a request is confirmed only once its reply is ACKed); a worker
    that dies returns them to the queue for the others."""

    def prefetch(self, concurrency: int) -> int:
        """``extra_requests``, or its default for ``concurrency`` threads."""
        return concurrency if self.extra_requests is None else self.extra_requests

    def __post_init__(self) -> None:
        for name in ("heartbeat_interval", "first_beat_after", "reply_window", "caller_grace"):
            if not getattr(self, name) > 0:
                raise InvalidArgumentError(f"{name} must be > 0")
        if self.max_replies < 1:
            raise InvalidArgumentError("max_replies must be >= 1")
        if self.extra_requests is not None and self.extra_requests < 0:
            raise InvalidArgumentError("extra_requests must be >= 0")
        if self.stop_timeout < 0:
            raise InvalidArgumentError("stop_timeout must be >= 0")
