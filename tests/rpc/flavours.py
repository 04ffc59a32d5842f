"""The two request/reply front-ends, behind one test surface: the threaded
``Session``/``Worker`` and the asyncio ones (run on a loop in a thread of the test), so
the fault tests run against both (``flavour`` fixture)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol, TypeVar

from holdfast.sdk import Reply, Request, Session, Worker, WorkerOptions, aio
from holdfast.sdk.rpc.calls import CallState
from tests.support.sessions import FAST

T = TypeVar("T")
Handler = Callable[[Request], bytes]


class CallerHandle(Protocol):
    """What the tests do with a caller."""

    def request_async(
        self, uri: str, payload: bytes, timeout: float
    ) -> concurrent.futures.Future[Reply]: ...

    def calls(self) -> list[CallState]: ...


class WorkerHandle(Protocol):
    """What the tests read of a worker."""

    handler_runs: int
    replies_replayed: int


class Flavour(Protocol):
    """One front-end."""

    name: str

    def caller(self, address: str) -> AbstractContextManager[CallerHandle]: ...

    def worker(
        self, address: str, uri: str, handle: Handler, options: WorkerOptions
    ) -> AbstractContextManager[WorkerHandle]: ...


class _SyncCaller:
    def __init__(self, session: Session) -> None:
        self._session = session

    def request_async(
        self, uri: str, payload: bytes, timeout: float
    ) -> concurrent.futures.Future[Reply]:
        return self._session.request_async(uri, payload, timeout=timeout)

    def calls(self) -> list[CallState]:
        return list(self._session._rpc()._calls.values())


class SyncFlavour:
    """``holdfast.sdk.Session`` and ``Worker``."""

    name = "sync"

    @contextmanager
    def caller(self, address: str) -> Iterator[CallerHandle]:
        with Session(address, options=FAST) as session:
            yield _SyncCaller(session)

    @contextmanager
    def worker(
        self, address: str, uri: str, handle: Handler, options: WorkerOptions
    ) -> Iterator[WorkerHandle]:
        with (
            Session(address, options=FAST) as session,
            Worker(session, uri, handle, options=options) as worker,
        ):
            yield worker


class LoopThread:
    """An event loop on a thread of its own; ``run`` waits for a coroutine there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coroutine`` on the loop."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        """Run ``coroutine`` on the loop and wait for its result."""
        return self.submit(coroutine).result(timeout)

    def stop(self) -> None:
        """Stop the loop and join its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class _AioCaller:
    def __init__(self, runner: LoopThread, session: aio.Session) -> None:
        self._runner = runner
        self._session = session

    def request_async(
        self, uri: str, payload: bytes, timeout: float
    ) -> concurrent.futures.Future[Reply]:
        return self._runner.submit(self._session.request(uri, payload, timeout=timeout))

    def calls(self) -> list[CallState]:
        caller = self._session._caller
        return [] if caller is None else list(caller._calls.values())


class AioFlavour:
    """``holdfast.sdk.aio.Session`` and ``Worker`` on a loop thread."""

    name = "aio"

    @contextmanager
    def caller(self, address: str) -> Iterator[CallerHandle]:
        runner = LoopThread()
        try:
            session = runner.run(_open_session(address))
            try:
                yield _AioCaller(runner, session)
            finally:
                runner.run(session.close())
        finally:
            runner.stop()

    @contextmanager
    def worker(
        self, address: str, uri: str, handle: Handler, options: WorkerOptions
    ) -> Iterator[WorkerHandle]:
        runner = LoopThread()
        try:
            session = runner.run(_open_session(address))
            try:
                worker = runner.run(_start_worker(session, uri, handle, options))
                try:
                    yield worker
                finally:
                    runner.run(worker.close())
            finally:
                runner.run(session.close())
        finally:
            runner.stop()


async def _open_session(address: str) -> aio.Session:
    session = aio.Session(address, options=FAST)
    return await session.__aenter__()


async def _start_worker(
    session: aio.Session, uri: str, handle: Handler, options: WorkerOptions
) -> aio.Worker:
    return await aio.Worker(session, uri, handle, options=options).start()


FLAVOURS: dict[str, Flavour] = {"sync": SyncFlavour(), "aio": AioFlavour()}
