"""Proxies: listen, dial the upstream for each client, move bytes through the toxics.

Each accepted connection gets two ``Link``s: ``upstream`` (client to server) and
``downstream`` (server to client). A link has a reader task, which reads chunks
from its source into a small buffer (so a slow toxic pushes back on the sender
through TCP, as Toxiproxy's unbuffered channels do), and a pump task, which
passes each chunk through the link's toxic runs in chain order and writes it to
its destination. When a source ends, the end goes through the chain too (so
``slow_close`` can hold it), the destination is closed, and that in turn ends
the other direction: a proxied connection closes as a whole, as in Toxiproxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections import deque
from collections.abc import Callable
from typing import Any

from tests.toxiproxy_server.toxics import (
    RUNS,
    ApiError,
    Chunk,
    LinkEnded,
    Toxic,
    ToxicRun,
    checked_attributes,
    checked_toxicity,
)

log = logging.getLogger("toxiproxy_server")

READ_SIZE = 32 * 1024
"""Bytes read from a socket at a time (Go's io.Copy buffer)."""

DIAL_TIMEOUT = 5.0
"""Seconds the upstream may take to accept a connection before the client is dropped."""


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``[HOST]:PORT``) as a pair; ``ValueError`` if it is not one."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"not a HOST:PORT address: {address!r}")
    return host.strip("[]"), int(port)


class ChunkBuffer:
    """A single-producer, single-consumer queue whose capacity can change (it grows
    while a latency toxic needs the reader to run ahead)."""

    def __init__(self, capacity: Callable[[], int]) -> None:
        self._capacity = capacity
        self._items: deque[Chunk | None] = deque()
        self._ready = asyncio.Event()
        self._space = asyncio.Event()

    async def put(self, item: Chunk | None) -> None:
        """Add a chunk (``None``: end of stream), waiting while the buffer is full."""
        while len(self._items) >= self._capacity():
            self._space.clear()
            await self._space.wait()
        self._items.append(item)
        self._ready.set()

    async def get(self) -> Chunk | None:
        """Take the oldest chunk, waiting for one."""
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        self._space.set()
        return item

    def capacity_changed(self) -> None:
        """Wake a waiting producer: the buffer may have room now."""
        self._space.set()


class Link:
    """One direction of one proxied connection."""

    def __init__(
        self,
        connection: Connection,
        stream: str,
        source: asyncio.StreamReader,
        dest: asyncio.StreamWriter,
    ) -> None:
        self.connection = connection
        self.stream = stream
        self.runs: list[ToxicRun] = []
        self._source = source
        self._dest = dest
        self._buffer = ChunkBuffer(self._capacity)
        self._loop = asyncio.get_running_loop()

    def _capacity(self) -> int:
        return max((run.BUFFER for run in self.runs if run.active), default=1)

    # -- the chain ------------------------------------------------------------------

    def attach(self, toxic: Toxic) -> None:
        """Add a toxic at the end of the chain."""
        run = RUNS[toxic.type](toxic, self.connection)
        self.runs.append(run)
        run.start()
        self._buffer.capacity_changed()

    def detach(self, name: str) -> None:
        """Remove a toxic from the chain (a chunk it holds is passed on)."""
        for index, run in enumerate(self.runs):
            if run.toxic.name == name:
                del self.runs[index]
                run.stop(removed=True)
                return

    def replace(self, toxic: Toxic) -> None:
        """Apply an updated toxic in place of the old one, keeping its state."""
        for index, run in enumerate(self.runs):
            if run.toxic.name == toxic.name:
                fresh = RUNS[toxic.type](toxic, self.connection)
                fresh.inherit(run)
                self.runs[index] = fresh
                run.stop(removed=False)
                fresh.start()
                self._buffer.capacity_changed()
                return

    def stop_runs(self) -> None:
        """The connection is gone: stop every run (timers, sleeps)."""
        for run in self.runs:
            run.stop(removed=False)

    # -- the tasks ------------------------------------------------------------------

    async def read(self) -> None:
        """Read chunks from the source until it ends."""
        while True:
            try:
                data = await self._source.read(READ_SIZE)
            except (ConnectionError, OSError):
                data = b""
            if not data:
                await self._buffer.put(None)
                return
            await self._buffer.put(Chunk(data, self._loop.time()))

    async def pump(self) -> None:
        """Pass chunks through the chain to the destination; close it at the end."""
        try:
            while True:
                chunk = await self._buffer.get()
                if chunk is None:
                    for run in list(self.runs):
                        await run.eof()
                    return
                await self._through(chunk, tuple(self.runs), 0)
        except (LinkEnded, ConnectionError, OSError):
            pass
        finally:
            # Closing our destination ends the other direction's source: the whole
            # connection closes, as in Toxiproxy.
            self._dest.close()

    async def _through(self, chunk: Chunk, runs: tuple[ToxicRun, ...], index: int) -> None:
        while index < len(runs) and runs[index].stopped.is_set():
            index += 1  # removed since this chunk entered the chain
        if index == len(runs):
            await self._write(chunk)
            return
        after = index + 1
        await runs[index].handle(chunk, lambda c: self._through(c, runs, after))

    async def _write(self, chunk: Chunk) -> None:
        if self._dest.is_closing():
            raise LinkEnded
        self._dest.write(chunk.data)
        await self._dest.drain()


class Connection:
    """A proxied client connection and its upstream connection."""

    def __init__(
        self,
        proxy: Proxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.proxy = proxy
        self._writers = (client[1], upstream[1])
        self.links = {
            "upstream": Link(self, "upstream", client[0], upstream[1]),
            "downstream": Link(self, "downstream", upstream[0], client[1]),
        }
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False

    def start(self, toxics: list[Toxic]) -> None:
        """Attach the proxy's toxics and start moving bytes."""
        for toxic in toxics:
            self.links[toxic.stream].attach(toxic)
        loop = asyncio.get_running_loop()
        for link in self.links.values():
            for work in (link.read(), link.pump()):
                task = loop.create_task(work)
                self._tasks.add(task)
                task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("proxy %s: a link task failed: %r", self.proxy.name, error)
        if not self._tasks:
            self._finished()

    def _finished(self) -> None:
        for link in self.links.values():
            link.stop_runs()
        for writer in self._writers:
            writer.close()
        self.proxy.connections.discard(self)

    def close(self) -> None:
        """Close both sides gracefully (what was written is still delivered)."""
        if self.closed:
            return
        self.closed = True
        for writer in self._writers:
            writer.close()
        self._cancel_tasks()

    def reset(self) -> None:
        """Reset both sides: with SO_LINGER 0 a close sends an RST."""
        if self.closed:
            return
        self.closed = True
        linger = struct.pack("ii", 1, 0)
        for writer in self._writers:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            writer.transport.abort()
        self._cancel_tasks()

    def _cancel_tasks(self) -> None:
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        for link in self.links.values():
            link.stop_runs()


class Proxy:
    """A named TCP proxy from ``listen`` to ``upstream`` with its toxics."""

    def __init__(self, name: str, listen: str, upstream: str, enabled: bool) -> None:
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.enabled = enabled
        self.toxics: list[Toxic] = []
        self.connections: set[Connection] = set()
        self._server: asyncio.Server | None = None
        self._epoch = 0
        """Counts stops: a connection accepted before a stop is dropped after dialing."""

    def to_json(self) -> dict[str, Any]:
        """The proxy's JSON object, as Toxiproxy returns it."""
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": [toxic.to_json() for toxic in self.toxics],
        }

    # -- listening ------------------------------------------------------------------

    async def start(self) -> None:
        """Listen (a port 0 is replaced by the port bound); 500 if it cannot."""
        if self._server is not None:
            return
        host, port = split_address(self.listen)
        try:
            self._server = await asyncio.start_server(self._accept, host, port, reuse_address=True)
        except OSError as error:
            raise ApiError(f"listen tcp {self.listen}: {error.strerror or error}", 500) from None
        bound = self._server.sockets[0].getsockname()
        self.listen = f"{host}:{bound[1]}"
        self.enabled = True

    def stop(self) -> None:
        """Stop listening (new connections are refused) and close every connection."""
        self.enabled = False
        self._epoch += 1
        if self._server is not None:
            self._server.close()
            self._server = None
        for connection in list(self.connections):
            connection.close()

    async def update(self, body: dict[str, Any]) -> None:
        """Apply a POST /proxies/{name} body: a new listen or upstream restarts the
        proxy (dropping its connections); ``enabled`` starts or stops it."""
        listen = body.get("listen", self.listen)
        upstream = body.get("upstream", self.upstream)
        enabled = body.get("enabled", self.enabled)
        if not isinstance(listen, str) or not isinstance(upstream, str):
            raise ApiError("bad request body", 400)
        if not isinstance(enabled, bool):
            raise ApiError("bad request body: enabled must be a boolean", 400)
        try:
            split_address(listen)
            split_address(upstream)
        except ValueError as error:
            raise ApiError(str(error), 400) from None
        if (listen, upstream) != (self.listen, self.upstream):
            self.stop()
            self.listen, self.upstream = listen, upstream
        if enabled:
            await self.start()
        else:
            self.stop()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        epoch = self._epoch
        host, port = split_address(self.upstream)
        try:
            upstream = await asyncio.wait_for(asyncio.open_connection(host, port), DIAL_TIMEOUT)
        except (OSError, TimeoutError):
            # As Toxiproxy: a client whose upstream cannot be reached is hung up on.
            writer.close()
            return
        if epoch != self._epoch:  # disabled while we were dialing
            writer.close()
            upstream[1].close()
            return
        connection = Connection(self, (reader, writer), upstream)
        self.connections.add(connection)
        connection.start(list(self.toxics))

    # -- toxics ---------------------------------------------------------------------

    def toxic(self, name: str) -> Toxic:
        """The toxic called ``name`` (404 if none)."""
        for toxic in self.toxics:
            if toxic.name == name:
                return toxic
        raise ApiError("toxic not found", 404)

    def add_toxic(self, toxic: Toxic) -> None:
        """Add a toxic to the end of its stream's chain, on every connection."""
        if any(t.name == toxic.name for t in self.toxics):
            raise ApiError("toxic already exists", 409)
        self.toxics.append(toxic)
        for connection in list(self.connections):
            connection.links[toxic.stream].attach(toxic)

    def update_toxic(self, name: str, body: dict[str, Any]) -> Toxic:
        """Change a toxic's attributes and toxicity (other fields are kept)."""
        old = self.toxic(name)
        toxic = Toxic(
            old.name,
            old.type,
            old.stream,
            checked_toxicity(body.get("toxicity", old.toxicity)),
            checked_attributes(old.type, body.get("attributes"), old.attributes),
        )
        self.toxics[self.toxics.index(old)] = toxic
        for connection in list(self.connections):
            connection.links[toxic.stream].replace(toxic)
        return toxic

    def remove_toxic(self, name: str) -> None:
        """Remove a toxic from every connection."""
        toxic = self.toxic(name)
        self.toxics.remove(toxic)
        for connection in list(self.connections):
            connection.links[toxic.stream].detach(name)

    def remove_all_toxics(self) -> None:
        """Remove every toxic (``/reset``)."""
        for toxic in list(self.toxics):
            self.remove_toxic(toxic.name)
