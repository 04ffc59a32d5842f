"""A worker answers only into a caller's reply queue of its service's own domain
(issue #17, confused deputy): the broker checks that a caller may write the service's
queue, never the ``x-rpc-reply-to`` it names, and a worker whose token writes more
domains than the caller's would otherwise post the reply, for the caller, where the
caller may not write. Both front-ends; a real broker with tokens."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdfast.sdk import Request, Session, Worker, aio
from holdfast.sdk.admin import AdminClient
from holdfast.sdk.errors import QueueNotFoundError
from holdfast.sdk.rpc import wire
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST

pytestmark = pytest.mark.timeout(60)

CALLER, WORKER, OPS = "caller-token-0001", "worker-token-0001", "ops-token-000001"
LEDGER = "hf://billing/ledger"


@pytest.fixture
def auth_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker where the caller may write only ``infra`` and the worker ``infra`` and
    ``billing``."""
    grants = [
        (CALLER, ["infra"], ["infra"], False),
        (WORKER, ["infra"], ["infra", "billing"], False),
        (OPS, ["*"], ["*"], True),
    ]
    tokens = [
        {"token": t, "name": t.split("-")[0], "read": r, "write": w, "admin": a}
        for t, r, w, a in grants
    ]
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": tokens}))
    with BrokerProcess(["--auth-file", str(path)]) as broker:
        yield broker


def _forge(address: str, uri: str) -> None:
    """As the caller: requests naming a reply queue the worker must refuse, each ACKed
    by the broker (the caller may write the service queue)."""
    durable_guid = uuid.uuid4()
    forged = [
        {wire.REPLY_TO: LEDGER},  # another domain
        {wire.REPLY_TO: "hf://infra/not-a-reply-queue"},  # not the SDK's reply naming
        # A durable request whose reply queue is not the one named from its own GUID.
        {
            wire.REPLY_TO: wire.durable_reply_uri("infra", durable_guid),
            wire.KEEP_UNTIL: str(wire.wall_ms() + 60_000),
        },
    ]
    options = dataclasses.replace(FAST, token=CALLER)
    with Session(address, options=options) as caller:
        queue = caller.open_queue(uri, write=True, timeout=10)
        acks: list[bool] = []
        for properties in forged:
            properties = {wire.EXPIRES: "0", **properties}
            queue.post(b"forged", properties, lambda ack: acks.append(ack.status.ok))
        assert caller.flush(10) and acks == [True, True, True]


def _ledger(address: str) -> int:
    with AdminClient(address, token=OPS) as admin:
        try:
            return admin.stats(LEDGER).ready
        except QueueNotFoundError:
            return 0


def _assert_refused(runs: list[bytes], caplog: pytest.LogCaptureFixture, address: str) -> None:
    assert runs == [b"good"]
    assert _ledger(address) == 0
    refused = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(LEDGER in text and "outside the service's domain" in text for text in refused)
    assert any("not-a-reply-queue" in text for text in refused), refused
    assert any("not its durable reply queue" in text for text in refused), refused


def test_the_threaded_worker_refuses_a_reply_queue_it_must_not_write(
    auth_broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"hf://infra/svc-{uuid.uuid4().hex[:8]}"
    _forge(auth_broker.address, uri)
    runs: list[bytes] = []

    def handle(request: Request) -> bytes:
        runs.append(request.payload)
        return b"echo: " + request.payload

    caplog.set_level(logging.WARNING, "holdfast.sdk.rpc.worker")
    worker_options = dataclasses.replace(FAST, token=WORKER)
    with (
        Session(auth_broker.address, options=worker_options) as session,
        Worker(session, uri, handle),
        Session(auth_broker.address, options=dataclasses.replace(FAST, token=CALLER)) as caller,
    ):
        # Served after the forged ones (one consumer, in order): they were settled.
        assert caller.request(uri, b"good", timeout=20).payload == b"echo: good"
    _assert_refused(runs, caplog, auth_broker.address)


def test_the_asyncio_worker_refuses_a_reply_queue_it_must_not_write(
    auth_broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    uri = f"hf://infra/svc-{uuid.uuid4().hex[:8]}"
    _forge(auth_broker.address, uri)
    runs: list[bytes] = []

    async def handle(request: Request) -> bytes:
        runs.append(request.payload)
        return b"echo: " + request.payload

    async def run() -> bytes:
        worker_options = dataclasses.replace(FAST, token=WORKER)
        caller_options = dataclasses.replace(FAST, token=CALLER)
        async with (
            aio.Session(auth_broker.address, options=worker_options) as session,
            aio.Worker(session, uri, handle),
            aio.Session(auth_broker.address, options=caller_options) as caller,
        ):
            return (await caller.request(uri, b"good", timeout=20)).payload

    caplog.set_level(logging.WARNING, "holdfast.sdk.rpc.worker")
    assert asyncio.run(run()) == b"echo: good"
    _assert_refused(runs, caplog, auth_broker.address)


def test_a_durable_request_naming_its_own_reply_queue_is_served(
    auth_broker: BrokerProcess,
) -> None:
    """The check lets through what the SDK's callers send: ``request_durable``'s own
    queue (the ordinary reply queue is covered by every other test)."""
    uri = f"hf://infra/svc-{uuid.uuid4().hex[:8]}"
    with (
        Session(auth_broker.address, options=dataclasses.replace(FAST, token=WORKER)) as session,
        Worker(session, uri, lambda request: b"kept: " + request.payload),
        Session(auth_broker.address, options=dataclasses.replace(FAST, token=CALLER)) as caller,
    ):
        rid = caller.request_durable(uri, b"d", keep=30, timeout=10)
        assert caller.fetch_reply(rid, timeout=20).payload == b"kept: d"
