"""One connection driver around ``SessionEngine``, for every front-end.

``core`` decides (connect, failover, back-off, the Hello deadline, parsing,
batching, error containment) without I/O; ``threaded`` and ``aio`` are the two
pumps that wait for it, on threads or on an event loop.
"""

from holdfast.sdk.driver.aio import AsyncDriver
from holdfast.sdk.driver.core import MAX_BAD_CONNECTIONS, DriverCore
from holdfast.sdk.driver.threaded import ThreadDriver

__all__ = ["MAX_BAD_CONNECTIONS", "AsyncDriver", "DriverCore", "ThreadDriver"]
