"""The conformance suite's world: the real broker on a manual clock, on any store, seen
directly or through a real proxy.

``LocalBroker`` runs ``holdfast.broker.server.Broker`` on an event loop thread of its
own, serving gRPC on 127.0.0.1 (a free port, kept across a restart), with its broker
clock and (Redis) wall clock read from a ``ManualTime`` the test steps: TTLs, reject
delays and pickup deadlines pass without waiting for them. The broker's sweep still
runs every 0.1 s of real time, so a test waits (bounded) for the sweep to see the step.

``World`` is what a test gets: a store, a path (``direct`` or ``proxy``), the address
its clients connect to, the broker behind it and an admin client of the broker.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from holdfast.broker.config import BrokerConfig
from holdfast.broker.dedup import BrokerClock
from holdfast.broker.server import Broker
from holdfast.sdk import Session
from holdfast.sdk.admin import AdminClient
from holdfast.sdk.options import ReconnectOptions, SessionOptions
from tests.support.processes import ProxyProcess
from tests.support.redis_server import free_port

FAST = SessionOptions(reconnect=ReconnectOptions(initial=0.01, maximum=0.1))
"""Sessions that reconnect within 0.1 s."""

WALL_EPOCH_MS = 1_800_000_000_000
"""Where the manual wall clock starts (Redis keeps acceptance times in wall-clock ms)."""


class ManualTime:
    """A clock only the test moves: seconds since it was made, never by itself."""

    def __init__(self) -> None:
        self._now = 1000.0
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        """The broker clock's source."""
        with self._lock:
            return self._now

    def wall_ms(self) -> int:
        """The Redis nodes' wall clock, in ms."""
        with self._lock:
            return WALL_EPOCH_MS + round(self._now * 1000)

    def advance(self, seconds: float) -> None:
        """Step time forward."""
        with self._lock:
            self._now += seconds


async def _cancel_the_rest() -> None:
    """Cancel every other task of the running loop and wait for them to end."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class LocalBroker:
    """The real broker on a thread of its own, on a manual clock."""

    def __init__(self, store: str, time: ManualTime, **config: Any) -> None:
        self.store = store
        self.time = time
        self.port = free_port()
        self._config = config
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.broker: Broker | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``, the same across restarts."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> LocalBroker:
        """Start (or start again, on the same port and store)."""
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="local-broker", daemon=True)
        self._thread.start()
        config = BrokerConfig(
            listen=self.address, store=self.store, shutdown_grace=0.5, **self._config
        )

        async def start() -> Broker:
            broker = Broker(
                config, clock=BrokerClock(self.time.monotonic), wall_ms=self.time.wall_ms
            )
            await broker.start()
            return broker

        self.broker = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
        return self

    def stop(self) -> None:
        """Stop gracefully and end the thread."""
        loop, broker = self._loop, self.broker
        if loop is None or broker is None:
            return
        asyncio.run_coroutine_threadsafe(broker.stop(0.5), loop).result(30)
        # What the broker left running (a Redis store's fire-and-forget counters) ends
        # here, as asyncio.run would end it: a task closed later by the garbage
        # collector, its loop gone, printed "no running event loop" in another test.
        asyncio.run_coroutine_threadsafe(_cancel_the_rest(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        assert self._thread is not None
        self._thread.join(10)
        loop.close()
        self._loop = self.broker = None

    def restart(self) -> None:
        """Stop and start again: what a durable store kept comes back."""
        self.stop()
        self.start()

    def call(self, work: Any) -> Any:
        """Run a plain function on the broker's loop and return its result."""
        assert self._loop is not None and self.broker is not None

        async def run() -> Any:
            return work(self.broker)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)


@dataclass
class World:
    """One store seen one way: what every conformance test runs against."""

    store_kind: str
    path: str
    """``direct`` or ``proxy``."""
    broker: LocalBroker
    address: str
    """Where clients connect: the broker, or the proxy in front of it."""
    admin: AdminClient
    proxy: ProxyProcess | None = None
    names: set[str] = field(default_factory=set)

    @property
    def time(self) -> ManualTime:
        """The broker's clock."""
        return self.broker.time

    @property
    def durable(self) -> bool:
        """Whether the store keeps messages across a broker restart."""
        return self.store_kind != "memory"

    def uri(self, name: str = "q") -> str:
        """A queue URI no other test of this world uses."""
        return f"hf://conformance/{name}-{uuid.uuid4().hex[:10]}"

    def session(self, **kwargs: Any) -> Session:
        """A session of this world's path (a context manager)."""
        kwargs.setdefault("options", FAST)
        return Session(self.address, **kwargs)


@contextmanager
def open_world(
    store_kind: str,
    store: str,
    path: str,
    directory: Path,
    *,
    proxy_args: Sequence[str] = (),
    admin_token: str | None = None,
    **config: Any,
) -> Iterator[World]:
    """Start a broker on ``store`` (and a proxy for the ``proxy`` path, with
    ``proxy_args``); ``config`` are more ``BrokerConfig`` fields."""
    with ExitStack() as stack:
        broker = LocalBroker(store, ManualTime(), **config).start()
        stack.callback(broker.stop)
        proxy = None
        address = broker.address
        if path == "proxy":
            proxy = stack.enter_context(ProxyProcess(["--upstream", broker.address, *proxy_args]))
            address = proxy.address
        admin = stack.enter_context(AdminClient(broker.address, token=admin_token))
        yield World(store_kind, path, broker, address, admin, proxy)


__all__ = ["FAST", "LocalBroker", "ManualTime", "World", "open_world"]
