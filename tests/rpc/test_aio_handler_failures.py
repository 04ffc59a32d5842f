"""What an asyncio ``Worker``'s handler raises beyond ``Exception`` is answered too, as
on the threaded worker: a ``CancelledError`` of its own (a helper task it awaited was
cancelled by something else), ``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit``
and any other ``BaseException``, from a coroutine handler or a plain function run in
the executor. Each left the call unanswered (``RpcTimeoutError`` at its timeout) and
the request unconfirmed: the worker here holds three (one slot, two prefetched), so
four such calls stopped it for good. And a fault of the worker's own on a request is
logged and the request confirmed, not left to wedge it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from holdfast.sdk import RemoteHandlerError, Request, RpcError
from holdfast.sdk.rpc import wire
from tests.rpc.support import aio_worker_and_caller
from tests.support.processes import BrokerProcess
from tests.support.sessions import unique_uri

HELD = 3
"""Requests the worker of ``aio_worker_and_caller`` holds (concurrency 1, prefetch 2)."""


class MyBase(BaseException):
    """A ``BaseException`` that is not an ``Exception``."""


async def _helper_cancelled() -> None:
    helper = asyncio.ensure_future(asyncio.sleep(10))
    asyncio.get_running_loop().call_later(0.05, helper.cancel)  # say, its connection closed
    await helper


async def _awaited_generator_exit() -> None:
    # Thrown into the worker's task from the future: past the handler's frames.
    future = asyncio.get_running_loop().create_future()
    future.set_exception(GeneratorExit())
    await future


def _raise(error: BaseException) -> Callable[[], None]:
    def raising() -> None:
        raise error

    return raising


FAILURES: dict[str, tuple[Callable[[], Any], str]] = {
    "helper-cancelled": (_helper_cancelled, "CancelledError"),
    "own-cancelled": (_raise(asyncio.CancelledError()), "CancelledError"),
    "awaited-generator-exit": (_awaited_generator_exit, "GeneratorExit"),
    "system-exit": (_raise(SystemExit(3)), "SystemExit"),
    "keyboard-interrupt": (_raise(KeyboardInterrupt()), "KeyboardInterrupt"),
    "generator-exit": (_raise(GeneratorExit()), "GeneratorExit"),
    "base-exception": (_raise(MyBase("custom")), "MyBase"),
}
PLAIN = ["system-exit", "keyboard-interrupt", "generator-exit", "base-exception"]


async def _calls_fail_then_serve(address: str, uri: str, handle: Any, error_type: str) -> None:
    async with aio_worker_and_caller(address, uri, handle) as caller:
        for _ in range(HELD + 1):
            with pytest.raises(RemoteHandlerError) as caught:
                await caller.request(uri, b"fail", timeout=5)
            assert caught.value.error_type == error_type
        assert (await caller.request(uri, b"x", timeout=5)).payload == b"ok"


@pytest.mark.parametrize("kind", sorted(FAILURES))
def test_a_coroutine_handler_s_base_exception_is_answered(broker: BrokerProcess, kind: str) -> None:
    fail, error_type = FAILURES[kind]

    async def handle(request: Request) -> bytes:
        if request.payload == b"fail":
            result = fail()
            if asyncio.iscoroutine(result):
                await result
        return b"ok"

    asyncio.run(_calls_fail_then_serve(broker.address, unique_uri("aio-base"), handle, error_type))


@pytest.mark.parametrize("kind", PLAIN)
def test_a_plain_handler_s_base_exception_is_answered(broker: BrokerProcess, kind: str) -> None:
    fail, error_type = FAILURES[kind]

    def handle(request: Request) -> bytes:
        if request.payload == b"fail":
            fail()
        return b"ok"

    uri = unique_uri("aio-plain-base")
    asyncio.run(_calls_fail_then_serve(broker.address, uri, handle, error_type))


def test_a_fault_of_the_worker_s_own_is_logged_and_does_not_wedge_it(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The reply of each of the first calls fails to post with a ``RuntimeError`` (a bug
    in the worker, not a refusal): unanswered, but confirmed, so the next call is
    served; before, the worker held them all unconfirmed, and took no more."""
    real = wire.expiring_reply
    faults = {"left": HELD}

    def faulty(properties: dict[str, str], request: Any) -> dict[str, str]:
        if faults["left"]:
            faults["left"] -= 1
            raise RuntimeError("a bug in posting")
        return real(properties, request)

    monkeypatch.setattr(wire, "expiring_reply", faulty)

    async def handle(request: Request) -> bytes:
        return b"ok"

    async def run() -> None:
        uri = unique_uri("aio-fault")
        async with aio_worker_and_caller(broker.address, uri, handle) as caller:
            for _ in range(HELD):
                with pytest.raises(
                    RpcError
                ):  # unanswered: timed out, or dead-lettered (no beat yet)
                    await caller.request(uri, b"x", timeout=1)
            assert (await caller.request(uri, b"x", timeout=5)).payload == b"ok"

    with caplog.at_level(logging.ERROR, "holdfast.sdk.rpc.worker"):
        asyncio.run(run())
    assert sum("failed in the worker" in r.getMessage() for r in caplog.records) == HELD
