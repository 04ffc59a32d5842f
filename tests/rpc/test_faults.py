"""Request/reply across failures: a worker, the proxy or the sqlite broker killed with
SIGKILL mid-call, a redelivered request answered from the kept reply, and a caller
that dies while its call runs; each against the threaded and the asyncio caller and
worker (``flavour``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from holdfast.sdk import Request, WorkerLostError, WorkerOptions
from tests.rpc.flavours import FLAVOURS, Flavour, WorkerHandle
from tests.rpc.support import caller_process, starts, wait_for_starts, worker_process
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import unique_uri
from tests.support.waiting import wait_until

QUICK = WorkerOptions(heartbeat_interval=0.2, first_beat_after=0.05, caller_grace=1.0)


@pytest.fixture(params=sorted(FLAVOURS))
def flavour(request: pytest.FixtureRequest) -> Flavour:
    """The threaded or the asyncio caller and worker."""
    return FLAVOURS[request.param]


def test_worker_killed_mid_call_another_worker_answers_once(
    broker: BrokerProcess, tmp_path: Path, flavour: Flavour
) -> None:
    uri, log = unique_uri("kill-worker"), tmp_path / "runs.log"
    aio = flavour.name == "aio"
    with (
        worker_process(broker.address, uri, log, sleep=1.0, aio=aio) as first,
        worker_process(broker.address, uri, log, sleep=1.0, aio=aio) as second,
        flavour.caller(broker.address) as caller,
    ):
        future = caller.request_async(uri, b"job", 30)
        ((guid, victim),) = wait_for_starts(log, 1)
        {first.pid: first, second.pid: second}[victim].kill()
        reply = future.result(30)
        survivor = second.pid if victim == first.pid else first.pid
        assert reply.payload == b"job|%d" % survivor
        assert reply.request_guid.hex == guid.replace("-", "")
        runs = starts(log)
        assert [pid for _, pid in runs] == [victim, survivor]  # at-least-once processing
        assert {g for g, _ in runs} == {guid}


def completes_across(
    flavour: Flavour, address: str, kill_and_restart: Callable[[], None], *, sleep: float = 1.5
) -> WorkerHandle:
    """Make one call whose handler runs ``sleep`` s; ``kill_and_restart`` a server meanwhile."""
    uri = unique_uri("outage")
    started = threading.Event()

    def handle(request: Request) -> bytes:
        started.set()
        request.cancelled.wait(sleep)
        return b"done:" + request.payload

    with (
        flavour.worker(address, uri, handle, QUICK) as worker,
        flavour.caller(address) as caller,
    ):
        future = caller.request_async(uri, b"x", 60)
        assert started.wait(20)
        kill_and_restart()
        assert future.result(60).payload == b"done:x"
    return worker


def test_call_completes_across_a_proxy_kill(broker: BrokerProcess, flavour: Flavour) -> None:
    with ProxyProcess(["--upstream", broker.address]) as proxy:

        def outage() -> None:
            proxy.kill()
            proxy.restart()

        worker = completes_across(flavour, proxy.address, outage)
    # The request came back (the proxy's upstream session died): joined, not re-run.
    assert worker.handler_runs == 1


def test_call_completes_across_a_sqlite_broker_kill(tmp_path: Path, flavour: Flavour) -> None:
    with BrokerProcess(["--store", f"sqlite:{tmp_path / 'broker.db'}"]) as broker:

        def outage() -> None:
            broker.kill()
            broker.restart()

        worker = completes_across(flavour, broker.address, outage)
    assert worker.handler_runs == 1


def test_redelivered_request_is_answered_from_the_kept_reply(
    broker: BrokerProcess, flavour: Flavour
) -> None:
    """The handler returns just as its worker loses the proxy, so the CONFIRM is lost
    and the broker redelivers a request whose reply exists: the kept reply answers it
    (under the same reply GUID) and the handler does not run again."""
    uri = unique_uri("idempotent")
    with ProxyProcess(["--upstream", broker.address]) as proxy:
        returned = threading.Event()

        def handle(request: Request) -> bytes:
            proxy.kill()  # the worker's link dies before the reply leaves
            returned.set()
            return b"once"

        with (
            flavour.worker(proxy.address, uri, handle, QUICK) as worker,
            flavour.caller(broker.address) as caller,
        ):
            future = caller.request_async(uri, b"", 60)
            assert returned.wait(20)
            proxy.restart()
            assert future.result(60).payload == b"once"
            wait_until(lambda: worker.replies_replayed == 1, 20, "the kept reply to be replayed")
            assert worker.handler_runs == 1


def test_caller_killed_mid_call_cancels_the_handler(
    broker: BrokerProcess, flavour: Flavour
) -> None:
    uri = unique_uri("caller-dies")
    started = threading.Event()
    cancelled = threading.Event()

    def handle(request: Request) -> bytes:
        started.set()
        if request.cancelled.wait(30):
            cancelled.set()
        return b""

    with (
        flavour.worker(broker.address, uri, handle, QUICK),
        caller_process(broker.address, uri, aio=flavour.name == "aio") as caller,
    ):
        assert started.wait(20)
        caller.kill()
        # Noticed from the caller's reply queue losing its consumer, for caller_grace.
        wait_until(cancelled.is_set, 15, "the handler to see its caller gone")


def test_worker_killed_with_no_other_worker_is_a_worker_lost_error(
    broker: BrokerProcess, tmp_path: Path, flavour: Flavour
) -> None:
    uri, log = unique_uri("lost"), tmp_path / "runs.log"
    with (
        worker_process(broker.address, uri, log, sleep=30, aio=flavour.name == "aio") as worker,
        flavour.caller(broker.address) as caller,
    ):
        future = caller.request_async(uri, b"job", 6)
        wait_for_starts(log, 1)
        wait_until(lambda: all(c.picked_up for c in caller.calls()), 10, "the first heartbeat")
        worker.kill()
        with pytest.raises(WorkerLostError):
            future.result(30)
