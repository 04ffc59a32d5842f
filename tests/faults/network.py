"""The networks the fault tests run on, with Toxiproxy between the hops::

    direct:  SDK -> toxiproxy -> broker
    proxy:   SDK -> toxiproxy -> holdfast-proxy -> toxiproxy -> broker
                    (client hop)                  (upstream hop)

A network's ``path`` says which hops a scenario's faults act on: ``all`` of them,
or, through the proxy, only the ``client`` hop or only the ``upstream`` hop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from holdfast.sdk import ConnectionLost, StateRestored
from tests.support.processes import BrokerProcess, ProxyProcess, ServerProcess
from tests.support.recorder import EventRecorder
from tests.support.toxics import link_address
from tests.support.waiting import wait_until

TOPOLOGIES = ("direct", "proxy")

PATHS = ("direct", "proxy", "proxy-client-hop", "proxy-upstream-hop")
"""A topology and the hops faults act on: every hop, or one hop of the proxy topology."""

PROXY_ARGS = ["--keepalive", "0.5", "--keepalive-timeout", "1", "--reconnect-max", "0.2"]
"""The proxy notices a dead upstream in about a second and retries every 50-200 ms."""

LinkFactory = Callable[[str, str], Any]

FAILED = pytest.StashKey[bool]()
"""Set on a test item whose setup or call failed."""

_FAULTED = {"all": (True, True), "client": (True, False), "upstream": (False, True)}
"""Which components a fault on each path cuts from the broker: (session, proxy)."""


@dataclass
class Network:
    """A broker, in the ``proxy`` topology a holdfast-proxy in front of it, and the
    Toxiproxy links on the way.

    ``entry(name)`` makes a link for one SDK session to connect through (to the
    broker, or to the proxy); ``hops(link)`` are the links a fault on that session's
    path acts on. Losses and restores are counted per component: the session's
    events and, through the proxy, the proxy's upstream events from its log.
    """

    topology: str
    broker: BrokerProcess
    new_link: LinkFactory
    proxy: ProxyProcess | None = None
    upstream: Any = None
    """The link between the proxy and the broker (``proxy`` topology)."""
    path: str = "all"
    """The hops faults act on: ``all``, ``client`` or ``upstream``."""
    entries: list[Any] = field(default_factory=list)

    @property
    def target(self) -> str:
        """Where SDK sessions' links lead: the proxy, or the broker."""
        return self.proxy.address if self.proxy is not None else self.broker.address

    def entry(self, name: str) -> Any:
        """A new link from an SDK session to the proxy (or broker); connect the session
        to ``link_address(link)``."""
        link = self.new_link(name, self.target)
        self.entries.append(link)
        return link

    def hops(self, link: Any) -> list[Any]:
        """The links a fault on the path of the session using ``link`` acts on."""
        if self.upstream is None:
            return [link]
        return {"all": [link, self.upstream], "client": [link], "upstream": [self.upstream]}[
            self.path
        ]

    @property
    def session_cut(self) -> bool:
        """Whether a fault on the path disconnects the SDK session itself (not only the
        proxy behind it)."""
        return self._faulted[0]

    @property
    def _faulted(self) -> tuple[bool, ...]:
        return (True,) if self.proxy is None else _FAULTED[self.path]

    # -- what the components noticed ------------------------------------------------

    def losses(self, events: EventRecorder) -> tuple[int, ...]:
        """Connection losses so far: the session's (and the proxy's upstream's)."""
        return self._counts(events, ConnectionLost, "ConnectionLost(")

    def restores(self, events: EventRecorder) -> tuple[int, ...]:
        """Restores after a loss so far: the session's (and the proxy's upstream's)."""
        return self._counts(events, StateRestored, "StateRestored(")

    def _counts(self, events: EventRecorder, kind: type, text: str) -> tuple[int, ...]:
        mine = len(events.of(kind))
        if self.proxy is None:
            return (mine,)
        return (mine, self.proxy.count(text))

    def wait_lost(
        self, events: EventRecorder, before: tuple[int, ...], timeout: float = 15.0
    ) -> None:
        """Wait until every component the path's faults cut from the broker has noticed
        a loss since ``before``."""
        wait_until(
            lambda: self._each_above(self.losses(events), before, self._faulted),
            timeout,
            f"the fault to be noticed ({self.topology}, {self.path} hops)",
        )

    def wait_restored(
        self, events: EventRecorder, before: tuple[int, ...], timeout: float = 30.0
    ) -> None:
        """Wait until every component the path's faults cut has restored since ``before``."""
        wait_until(
            lambda: self._each_above(self.restores(events), before, self._faulted),
            timeout,
            f"the restore ({self.topology}, {self.path} hops)",
        )

    def wait_broker_side_lost(
        self, events: EventRecorder, before: tuple[int, ...], timeout: float = 15.0
    ) -> None:
        """Wait until the broker's own client (the proxy, or the session) noticed a
        loss since ``before``: a fault of the broker, which the proxy hides from its
        clients."""
        wait_until(
            lambda: self.losses(events)[-1] > before[-1], timeout, "the broker's client to notice"
        )

    def wait_broker_side_restored(
        self, events: EventRecorder, before: tuple[int, ...], timeout: float = 30.0
    ) -> None:
        """Wait until the broker's own client restored its state since ``before``."""
        wait_until(
            lambda: self.restores(events)[-1] > before[-1],
            timeout,
            "the broker's client to restore",
        )

    @staticmethod
    def _each_above(
        now: tuple[int, ...], before: tuple[int, ...], faulted: tuple[bool, ...]
    ) -> bool:
        return all(n > b for n, b, hit in zip(now, before, faulted, strict=True) if hit)


@contextlib.contextmanager
def network(name: str, broker: BrokerProcess, new_link: LinkFactory) -> Iterator[Network]:
    """Build the ``Network`` a ``TOPOLOGIES`` or ``PATHS`` name describes, around a
    started broker; the proxy it starts is stopped by PID at the end (links are
    deleted by their fixture)."""
    if name == "direct":
        built = Network("direct", broker, new_link)
        with report_on_error(built):
            yield built
        return
    path = {"proxy": "all", "proxy-client-hop": "client", "proxy-upstream-hop": "upstream"}[name]
    upstream = new_link("upstream", broker.address)
    with ProxyProcess(["--upstream", link_address(upstream), *PROXY_ARGS]) as proxy:
        built = Network("proxy", broker, new_link, proxy=proxy, upstream=upstream, path=path)
        with report_on_error(built):
            yield built


@contextlib.contextmanager
def report_on_error(net: Network) -> Iterator[None]:
    """``report(net)`` if the block raises."""
    try:
        yield
    except BaseException:
        report(net)
        raise


def report(net: Network) -> None:
    """Print the broker's and proxy's last log lines (pytest shows them with a failure)."""
    servers: list[ServerProcess] = [net.broker] if net.proxy is None else [net.broker, net.proxy]
    for server in servers:
        print(f"--- {server.module} (pid {server.pid}, exit {server.returncode}) ---")
        print(server.output)


@contextlib.contextmanager
def reported(request: pytest.FixtureRequest, net: Network) -> Iterator[Network]:
    """Yield ``net``; print the servers' logs at teardown if the test failed."""
    yield net
    if request.node.stash.get(FAILED, False):
        report(net)
