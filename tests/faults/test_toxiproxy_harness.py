"""The Toxiproxy harness itself: its API as the ``toxiproxy-python`` client drives it,
and each toxic doing what Toxiproxy's README documents.

These tests go only through the client (and, for the toxic update the client lacks,
plain HTTP), so they also pass against the real ``toxiproxy-server``. Timing bounds
are generous: a loaded test machine may be slow, never fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from tests.support.toxics import ToxiproxyServer, free_port, link_address, toxic
from tests.support.waiting import wait_until

LinkFactory = Callable[[str, str], Any]
Handler = Callable[[socket.socket], None]


class TcpServer:
    """A threaded TCP server on 127.0.0.1 running ``handler(conn)`` for each connection."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.received: list[bytes] = []
        """What ``record`` handlers received, one entry per connection."""
        self._connections: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            self._connections.append(conn)
            worker = threading.Thread(target=self._run, args=(conn,), daemon=True)
            self._threads.append(worker)
            worker.start()

    def _run(self, conn: socket.socket) -> None:
        try:
            self._handler(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        """Stop accepting, close every connection and wait for the handlers."""
        # shutdown() wakes the thread blocked in accept(); close() alone does not.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for conn in self._connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._acceptor.join(5)
        for worker in self._threads:
            worker.join(5)


def echo(conn: socket.socket) -> None:
    """Send back whatever arrives, until the client closes."""
    while data := conn.recv(65536):
        conn.sendall(data)


def sender(data: bytes) -> Handler:
    """A handler that sends ``data`` and closes."""

    def send(conn: socket.socket) -> None:
        conn.sendall(data)

    return send


def recorder(server: list[TcpServer]) -> Handler:
    """A handler that keeps everything it receives in ``server[0].received``."""

    def record(conn: socket.socket) -> None:
        chunks = []
        while data := conn.recv(65536):
            chunks.append(data)
        server[0].received.append(b"".join(chunks))

    return record


@pytest.fixture
def tcp_server() -> Iterator[Callable[[Handler], TcpServer]]:
    """Start TCP servers in this process; each is closed at teardown."""
    servers: list[TcpServer] = []

    def start(handler: Handler) -> TcpServer:
        server = TcpServer(handler)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def connect(link: Any, timeout: float = 5.0) -> socket.socket:
    """A client connection through ``link``."""
    host, port = link_address(link).rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)


def recv_exactly(sock: socket.socket, count: int) -> bytes:
    """Read ``count`` bytes (fewer only if the peer closes first)."""
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            break
        data += chunk
    return data


def recv_all(sock: socket.socket) -> bytes:
    """Read until the peer closes."""
    chunks = []
    while data := sock.recv(65536):
        chunks.append(data)
    return b"".join(chunks)


def round_trip(sock: socket.socket, payload: bytes = b"ping") -> float:
    """Seconds for ``payload`` to come back from an echo server."""
    started = time.monotonic()
    sock.sendall(payload)
    assert recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - started


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the peer closed or reset the connection (waits up to the socket timeout)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def api(toxiproxy_server: ToxiproxyServer, method: str, path: str, body: object) -> Any:
    """A raw API call, for what the client library lacks (a toxic update)."""
    request = urllib.request.Request(
        f"http://{toxiproxy_server.host}:{toxiproxy_server.port}{path}",
        data=json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


# -- the API -------------------------------------------------------------------------


def test_proxies_are_created_listed_and_deleted(
    toxiproxy: Any, toxic_link: LinkFactory, tcp_server: Callable[[Handler], TcpServer]
) -> None:
    server = tcp_server(echo)
    link = toxic_link("api", server.address)
    assert link.upstream == server.address
    assert link.enabled is True
    assert link_address(link).startswith("127.0.0.1:")
    assert not link_address(link).endswith(":0")  # the port actually bound
    listed = toxiproxy.proxies()
    assert listed[link.name].listen == link.listen
    assert toxiproxy.get_proxy(link.name).upstream == server.address
    with pytest.raises(ProxyExists):
        toxiproxy.create(upstream=server.address, name=link.name)
    assert toxiproxy.version()

    with connect(link) as sock:
        assert round_trip(sock) < 2.0
    assert link.destroy()
    assert toxiproxy.get_proxy(link.name) is None
    with pytest.raises(ConnectionRefusedError):
        connect(link)
    with pytest.raises(NotFound):
        link.toxics()


def test_toxics_are_added_listed_updated_and_removed(
    toxiproxy_server: ToxiproxyServer,
    toxic_link: LinkFactory,
    tcp_server: Callable[[Handler], TcpServer],
) -> None:
    link = toxic_link("toxics", tcp_server(echo).address)
    link.add_toxic(type="latency", attributes={"latency": 50})
    toxics = link.toxics()
    assert list(toxics) == ["latency_downstream"]  # the default name is <type>_<stream>
    added = toxics["latency_downstream"]
    assert (added.type, added.stream, added.toxicity) == ("latency", "downstream", 1.0)
    assert added.attributes["latency"] == 50
    with pytest.raises(ProxyExists):  # the client maps every 409 to ProxyExists
        link.add_toxic(type="latency", attributes={"latency": 10})
    with pytest.raises(InvalidToxic):
        link.add_toxic(type="no_such_toxic")
    with pytest.raises(InvalidToxic):
        link.add_toxic(type="latency", stream="sideways")

    path = f"/proxies/{link.name}/toxics/latency_downstream"
    updated = api(toxiproxy_server, "POST", path, {"attributes": {"jitter": 5}})
    assert updated["attributes"]["latency"] == 50  # kept
    assert updated["attributes"]["jitter"] == 5
    assert link.get_toxic("latency_downstream").attributes["jitter"] == 5

    assert link.destroy_toxic("latency_downstream")
    assert link.toxics() == {}
    with pytest.raises(NotFound):
        link.destroy_toxic("latency_downstream")


def test_reset_enables_every_proxy_and_removes_every_toxic(
    toxiproxy: Any, toxic_link: LinkFactory, tcp_server: Callable[[Handler], TcpServer]
) -> None:
    link = toxic_link("reset", tcp_server(echo).address)
    link.add_toxic(type="timeout", attributes={"timeout": 0})
    link.disable()
    assert toxiproxy.get_proxy(link.name).enabled is False
    assert toxiproxy.reset()
    assert toxiproxy.get_proxy(link.name).enabled is True
    assert link.toxics() == {}
    with connect(link) as sock:
        assert round_trip(sock) < 2.0


# -- plain proxying ------------------------------------------------------------------


def test_bytes_pass_unchanged_in_both_directions(
    toxic_link: LinkFactory, tcp_server: Callable[[Handler], TcpServer]
) -> None:
    link = toxic_link("bytes", tcp_server(echo).address)
    payload = os.urandom(2 * 1024 * 1024)
    with connect(link) as sock:
        writer = threading.Thread(target=sock.sendall, args=(payload,))
        writer.start()
        received = recv_exactly(sock, len(payload))
        writer.join(10)
    assert received == payload


def test_disable_closes_connections_and_refuses_new_ones_until_enabled(
    toxic_link: LinkFactory, tcp_server: Callable[[Handler], TcpServer]
) -> None:
    link = toxic_link("down", tcp_server(echo).address)
    with connect(link) as sock:
        round_trip(sock)
        with link.down():
            assert closed_by_peer(sock)
            with pytest.raises(ConnectionRefusedError):
                connect(link)
    with connect(link) as again:  # the same port again
        assert round_trip(again) < 2.0


def test_an_unreachable_upstream_hangs_up_on_the_client(toxic_link: LinkFactory) -> None:
    link = toxic_link("nowhere", f"127.0.0.1:{free_port()}")
    with connect(link) as sock:
        assert closed_by_peer(sock)


# -- each toxic ----------------------------------------------------------------------


def test_latency_delays_each_direction_and_keeps_the_link_pipelined(
    toxic_link: LinkFactory, tcp_server: Callable[[Handler], TcpServer]
) -> None:
    link = toxic_link("latency", tcp_server(echo).address)
    with connect(link) as sock:
        assert round_trip(sock) < 0.2
        with toxic(link, "latency", latency=300):
            assert 0.29 <= round_trip(sock) < 1.5
            # Twenty writes in a row arrive one latency later, not twenty.
            started = time.monotonic()
            for i in range(20):
                sock.sendall(b"%02d" % i)
                time.sleep(0.01)  # separate chunks on the wire
            assert recv_exactly(sock, 40) == b"".join(b"%02d" % i for i in range(20))
            assert time.monotonic() - started < 1.5
        with toxic(link, "latency", stream="upstream", latency=200, jitter=100):
            trips = [round_trip(sock) for _ in range(5)]
            assert all(0.09 <= t < 1.5 for t in trips), trips
        assert round_trip(sock) < 0.2


def test_timeout_zero_is_a_black_hole_until_removed(
    toxic_link: LinkFactory, tcp_server: Callable[[Handler], TcpServer]
) -> None:
    link = toxic_link("blackhole", tcp_server(echo).address)
    with connect(link, timeout=0.5) as sock:
        round_trip(sock)
        link.add_toxic(type="timeout", attributes={"timeout": 0})
        sock.sendall(b"lost")
        with pytest.raises(TimeoutError):
            sock.recv(10)  # nothing comes back, and the connection stays open
        link.destroy_toxic("timeout_downstream")
        sock.settimeout(5)
        # Bytes were dropped, so removing the toxic closes the connection.
        assert closed_by_peer(sock)
    with connect(link) as fresh:
        assert round_trip(fresh) < 2.0


def test_timeout_closes_the_connection_after_the_timeout(
    toxic_link: LinkFactory, tcp_server: Callable[[Handler], TcpServer]
) -> None:
    link = toxic_link("timeout", tcp_server(echo).address)
    with toxic(link, "timeout", timeout=300), connect(link) as sock:
        started = time.monotonic()
        sock.sendall(b"lost")
        assert closed_by_peer(sock)
        assert 0.25 <= time.monotonic() - started < 3.0


def test_reset_peer_resets_the_connection_after_the_timeout(
    toxic_link: LinkFactory, tcp_server: Callable[[Handler], TcpServer]
) -> None:
    link = toxic_link("reset", tcp_server(echo).address)
    # Added before connecting: the real Toxiproxy sets SO_LINGER 0 when a link starts.
    with toxic(link, "reset_peer", stream="upstream", timeout=200), connect(link) as sock:
        started = time.monotonic()
        sock.sendall(b"x")
        with pytest.raises(ConnectionResetError):
            sock.recv(10)
        assert 0.15 <= time.monotonic() - started < 3.0


def test_bandwidth_limits_the_rate(
    toxic_link: LinkFactory, tcp_server: Callable[[Handler], TcpServer]
) -> None:
    payload = os.urandom(200_000)
    link = toxic_link("bandwidth", tcp_server(sender(payload)).address)
    with toxic(link, "bandwidth", rate=200), connect(link) as sock:  # 200 KB/s: ~1 s
        started = time.monotonic()
        received = recv_all(sock)
        elapsed = time.monotonic() - started
    assert received == payload
    assert 0.8 <= elapsed < 3.0


def test_limit_data_closes_the_connection_after_the_limit(
    toxic_link: LinkFactory, tcp_server: Callable[[Handler], TcpServer]
) -> None:
    payload = os.urandom(5000)
    link = toxic_link("limit", tcp_server(sender(payload)).address)
    with toxic(link, "limit_data", bytes=1000), connect(link) as sock:
        assert recv_all(sock) == payload[:1000]


def test_an_upstream_toxic_affects_only_client_to_server_bytes(
    toxic_link: LinkFactory, tcp_server: Callable[[Handler], TcpServer]
) -> None:
    holder: list[TcpServer] = []
    holder.append(tcp_server(recorder(holder)))
    link = toxic_link("upstream", holder[0].address)
    with toxic(link, "limit_data", stream="upstream", bytes=3), connect(link) as sock:
        sock.sendall(b"hello")
        assert closed_by_peer(sock)
    wait_until(lambda: holder[0].received, 5, "the server to see the connection end")
    assert holder[0].received == [b"hel"]


def test_slow_close_delays_the_close(
    toxic_link: LinkFactory, tcp_server: Callable[[Handler], TcpServer]
) -> None:
    link = toxic_link("slow-close", tcp_server(sender(b"bye")).address)
    with toxic(link, "slow_close", delay=400), connect(link) as sock:
        started = time.monotonic()
        assert recv_exactly(sock, 3) == b"bye"
        assert time.monotonic() - started < 0.3  # the data is not held...
        assert sock.recv(10) == b""  # ...the close is
        assert 0.35 <= time.monotonic() - started < 3.0


def test_toxicity_is_the_probability_that_a_connection_is_affected(
    toxic_link: LinkFactory, tcp_server: Callable[[Handler], TcpServer]
) -> None:
    link = toxic_link("toxicity", tcp_server(echo).address)

    def cut_short() -> bool:
        with connect(link) as sock:
            sock.sendall(b"ab")
            return recv_exactly(sock, 2) == b"a"  # limit_data applied: one byte, then closed

    with toxic(link, "limit_data", toxicity=0.5, bytes=1):
        outcomes = [cut_short() for _ in range(40)]
        # P(all 40 alike) = 2 * 0.5**40: this does not fail by chance.
        assert 0 < sum(outcomes) < 40
    with toxic(link, "limit_data", toxicity=0.0, bytes=1), connect(link) as sock:
        assert round_trip(sock, b"ab") < 2.0
    with toxic(link, "limit_data", toxicity=1.0, bytes=1):
        assert cut_short()


def test_our_server_stops_on_sigterm() -> None:
    server = ToxiproxyServer(prefer_real=False).start()
    try:
        with socket.create_connection((server.host, server.port), timeout=5):
            pass  # it listens
        os.kill(server.pid, signal.SIGTERM)
        wait_until(lambda: server.returncode is not None, 10, "the server to exit")
        assert server.returncode == 0
    finally:
        server.stop()
