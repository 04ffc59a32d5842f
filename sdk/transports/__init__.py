"""Transports for the session driver: gRPC (threads or asyncio) and in-memory.

See ``holdfast.sdk.transports.base`` for the interface a transport implements.
"""

from holdfast.sdk.transports.base import (
    AsyncConnection,
    AsyncTransport,
    SyncConnection,
    SyncTransport,
)
from holdfast.sdk.transports.memory import (
    AsyncMemoryTransport,
    MemoryEndpoint,
    MemoryNetwork,
    MemoryTransport,
)

__all__ = [
    "AsyncConnection",
    "AsyncMemoryTransport",
    "AsyncTransport",
    "MemoryEndpoint",
    "MemoryNetwork",
    "MemoryTransport",
    "SyncConnection",
    "SyncTransport",
]
