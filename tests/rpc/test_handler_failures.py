"""How a handler's failure reaches its caller, on both front-ends (``flavour``): an
error whose text cannot be encoded (a lone surrogate, a ``__str__`` that raises), and,
on the threaded worker, ``SystemExit``, ``KeyboardInterrupt`` and ``GeneratorExit``.
Each is answered at once as ``RemoteHandlerError`` and costs the worker no slot: the
worker here has one, and the calls after the failures are still answered."""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable

import pytest

from holdfast.sdk import (
    RemoteHandlerError,
    Request,
    Session,
    StreamError,
    StreamingReply,
    Worker,
    WorkerOptions,
)
from holdfast.sdk.rpc import wire
from tests.rpc.flavours import FLAVOURS, Flavour
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST, unique_uri

QUICK = WorkerOptions(heartbeat_interval=0.2, first_beat_after=0.05, stop_timeout=5.0)

NAME = os.fsdecode(b"caf\xe9.txt")
"""A file name that is not UTF-8, as ``os.listdir`` gives it: ``'caf\\udce9.txt'``."""


class BadStr(Exception):
    """An exception whose ``__str__`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no str")


class Unreadable(io.RawIOBase):
    """A stream source whose read fails with a text holding a lone surrogate."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: object) -> int:
        raise OSError(f"cannot read {NAME}")


@pytest.fixture(params=sorted(FLAVOURS))
def flavour(request: pytest.FixtureRequest) -> Flavour:
    """The threaded or the asyncio caller and worker."""
    return FLAVOURS[request.param]


def test_wire_text_escapes_what_utf8_refuses_and_survives_a_broken_str() -> None:
    assert wire.error_text(ValueError(f"cannot open {NAME}")) == "cannot open caf\\udce9.txt"
    assert wire.error_text(BadStr()) == "<BadStr: str() raised RuntimeError>"
    assert len(wire.error_text(ValueError("\udce9" * 5000))) == wire.MAX_ERROR_TEXT


def _raising(make: Callable[[], BaseException]) -> Callable[[Request], bytes]:
    def handle(request: Request) -> bytes:
        if request.payload == b"fail":
            raise make()
        return b"ok:" + request.payload

    return handle


@pytest.mark.parametrize(
    ("make", "text"),
    [
        (lambda: ValueError(f"cannot process {NAME}"), "cannot process caf\\udce9.txt"),
        (BadStr, "<BadStr: str() raised RuntimeError>"),
    ],
    ids=["surrogate", "broken-str"],
)
def test_an_unencodable_handler_error_is_answered_at_once_and_frees_its_slot(
    broker: BrokerProcess, flavour: Flavour, make: Callable[[], BaseException], text: str
) -> None:
    uri = unique_uri("unencodable")
    with (
        flavour.worker(broker.address, uri, _raising(make), QUICK),
        flavour.caller(broker.address) as caller,
    ):
        for _ in range(2):  # the worker has one slot: a lost one shows at once
            # An unanswered call ends RpcTimeoutError at its 5 s: the type is the proof,
            # no wall-clock bound (a loaded host stretches any).
            with pytest.raises(RemoteHandlerError) as caught:
                caller.request_async(uri, b"fail", timeout=5).result(10)
            assert caught.value.message == text
        assert caller.request_async(uri, b"plain", timeout=5).result(10).payload == b"ok:plain"


@pytest.mark.parametrize("kind", [SystemExit, KeyboardInterrupt, GeneratorExit])
def test_a_threaded_handler_s_system_exit_is_a_handler_error_and_its_thread_lives(
    broker: BrokerProcess, kind: type[BaseException]
) -> None:
    uri = unique_uri("exits")
    with (
        Session(broker.address, options=FAST) as worker_session,
        Session(broker.address, options=FAST) as caller,
    ):
        worker = Worker(worker_session, uri, _raising(lambda: kind("from handler")), options=QUICK)
        with worker:
            for _ in range(2):  # one thread: had the first killed it, the second hangs
                with pytest.raises(RemoteHandlerError) as caught:
                    caller.request(uri, b"fail", timeout=5)
                assert caught.value.error_type == kind.__name__
            assert caller.request(uri, b"plain", timeout=5).payload == b"ok:plain"
            started = time.monotonic()
        # A lost thread would hold close for the whole stop_timeout (5 s).
        assert time.monotonic() - started < 4.5


def test_a_reply_stream_source_with_an_unencodable_error_fails_the_read_at_once(
    broker: BrokerProcess,
) -> None:
    uri = unique_uri("bad-source")
    with (
        Session(broker.address, options=FAST) as worker_session,
        Session(broker.address, options=FAST) as caller,
        Worker(worker_session, uri, lambda _: StreamingReply(b"r", {}, {"down": Unreadable()})),
    ):
        reply = caller.request(uri, b"", timeout=5)
        started = time.monotonic()
        with pytest.raises(StreamError) as caught:
            reply.streams["down"].read()
        assert time.monotonic() - started < 5  # not the 30 s stall
        assert "caf\\udce9.txt" in str(caught.value)


def test_a_handler_that_returns_an_int_is_a_handler_error(
    broker: BrokerProcess, flavour: Flavour
) -> None:
    """``bytes(42)`` is 42 zero bytes: a handler returning 42 answered those."""
    uri = unique_uri("int-reply")

    def handle(request: Request) -> bytes:
        return 42 if request.payload == b"int" else b"ok"  # type: ignore[return-value]

    with (
        flavour.worker(broker.address, uri, handle, QUICK),
        flavour.caller(broker.address) as caller,
    ):
        with pytest.raises(RemoteHandlerError) as caught:
            caller.request_async(uri, b"int", timeout=5).result(10)
        assert caught.value.error_type == "TypeError"
        assert "returned int, not bytes" in caught.value.message
        assert caller.request_async(uri, b"x", timeout=5).result(10).payload == b"ok"


def test_a_span_ended_with_an_error_whose_str_raises_ends_quietly() -> None:
    """With a tracer provider set (any, even one that records nothing), a served
    request's span ended with the handler's error: ``f"{error}"`` raised from a broken
    ``__str__``, the error reply was never posted, and the call timed out (seen in the
    full suite, after the OpenTelemetry tests had set the global provider)."""
    from opentelemetry import trace

    from holdfast.sdk import tracing

    span = trace.NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)
    tracing.fail(span, BadStr())  # raised RuntimeError("no str")
    tracing.fail(span, ValueError(f"cannot process {NAME}"))
