"""The Holdfast reference broker: queues, delivery, storage and GUID dedup over gRPC.

Modules, one job each:

* ``config``: ``BrokerConfig``, every option of a broker as one immutable value;
* ``server``: ``Broker``, the grpc.aio server on one event loop that owns all state;
* ``session``: one client stream: Hello, requests, dispatch, typed errors;
* ``outbox``: what one session has to send, in order, coalesced into batch frames;
* ``puts``: the PUT path: validate, deduplicate, store, enqueue, ACK;
* ``queues``: queues by URI, consumers, round-robin delivery within flow limits,
  redelivery;
* ``dedup``: the per-queue GUID history (window + grace, content digests, the
  broker-wide bound) and the broker's monotonic clock;
* ``store``: the storage interface (``Store``) and the in-memory store;
* ``sqlite_store``, ``sqlite_schema``, ``sqlite_rows``: the durable SQLite store: its
  writer thread and group commit, its file layout and recovery, its rows;
* ``cli``: the ``holdfast-broker`` command.

Run one in-process::

    broker = Broker(BrokerConfig(listen="127.0.0.1:0"))
    address = await broker.start()
    ...
    await broker.stop()
"""

from holdfast.broker.config import BrokerConfig
from holdfast.broker.server import Broker
from holdfast.broker.store import MemoryStore, RecoveredState, Store, StoreBatch
from holdfast.proto.logs import quiet_library_logger

quiet_library_logger()

__all__ = ["Broker", "BrokerConfig", "MemoryStore", "RecoveredState", "Store", "StoreBatch"]
