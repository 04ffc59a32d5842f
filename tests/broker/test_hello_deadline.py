"""A session stream must say Hello in time, and say it first (issue #33).

A stream that sends nothing, or bytes that do not parse, used to be kept open for
ever (the garbage one could even still say Hello later). Now a stream with no Hello
within ``--hello-timeout`` is ended with a fatal PROTOCOL_ERROR, and bytes that do not
parse before the Hello with a fatal MALFORMED_FRAME; on the broker and on the proxy's
client side alike (both serve ``holdfast.server.stream``). A client that said Hello
in time is not affected by the deadline.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from holdfast.proto import pb
from tests.broker.util import unique_uri
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.wire_client import WireClient

pytestmark = pytest.mark.timeout(60)

HELLO_TIMEOUT = "0.5"
GARBAGE = b"\xff\xff\xff\xff\x0f garbage"


@pytest.fixture(scope="module")
def broker() -> Iterator[BrokerProcess]:
    with BrokerProcess(["--hello-timeout", HELLO_TIMEOUT]) as process:
        yield process


@pytest.fixture(scope="module")
def proxy(broker: BrokerProcess) -> Iterator[ProxyProcess]:
    args = ["--upstream", broker.address, "--hello-timeout", HELLO_TIMEOUT]
    with ProxyProcess(args) as process:
        yield process


@pytest.fixture(params=["broker", "proxy"])
def address(request: pytest.FixtureRequest) -> str:
    server: BrokerProcess | ProxyProcess = request.getfixturevalue(request.param)
    return server.address


def fatal_error(client: WireClient) -> pb.Error:
    """The one frame of a stream the server ended: a fatal Error."""
    error: pb.Error = client.recv(timeout=10).error
    assert error.fatal
    assert client.ended(timeout=10).code.name == "OK"
    return error


def test_a_stream_that_never_says_hello_is_ended(address: str) -> None:
    with WireClient(address) as silent:
        error = fatal_error(silent)
        assert (error.status, error.message) == (pb.STATUS_PROTOCOL_ERROR, "no hello within 0.5 s")


def test_bytes_that_do_not_parse_before_hello_end_the_stream(address: str) -> None:
    with WireClient(address) as garbage:
        garbage.send_raw(GARBAGE)
        error = fatal_error(garbage)
        assert error.status == pb.STATUS_MALFORMED_FRAME
        assert error.message.startswith(f"before hello: {len(GARBAGE)} bytes that do not parse")


def test_a_client_that_said_hello_outlives_the_deadline(address: str) -> None:
    with WireClient(address) as client:
        client.hello()
        assert client.quiet("error", within=1.0) == []  # twice the deadline
        assert client.open(1, unique_uri("after-the-deadline"), write=True).status == pb.STATUS_OK
        # After the Hello, bytes that do not parse are answered and the stream goes on.
        client.send_raw(GARBAGE)
        error = client.recv("error").error
        assert (error.status, error.fatal) == (pb.STATUS_MALFORMED_FRAME, False)
        client.barrier()
