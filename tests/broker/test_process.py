"""The broker as a process: the listening line, signals, command-line errors."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from holdfast.proto import PROTOCOL_VERSION, pb
from tests.broker.util import connected, new_guid, unique_uri
from tests.support.processes import BrokerProcess
from tests.support.wire_client import WireClient


def test_listening_line_names_the_bound_port(broker: BrokerProcess) -> None:
    lines = [line for line in broker.output.splitlines() if "listening on" in line]
    assert len(lines) == 1
    match = re.search(r"listening on 127\.0\.0\.1:(\d+)", lines[0])
    assert match is not None
    port = int(match[1])
    assert port != 0
    assert broker.port == port
    assert broker.address == f"127.0.0.1:{port}"
    with connected(broker.address) as client:
        assert client.hello_reply is not None
        assert client.hello_reply.protocol_version == PROTOCOL_VERSION == 3


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_gracefully_and_tells_sessions(
    broker: BrokerProcess, signum: signal.Signals
) -> None:
    with connected(broker.address) as client:
        client.open(1, unique_uri("stop"), write=True)
        client.put(1, [(new_guid(), b"x", {})])
        client.acks(1)
        started = time.monotonic()
        os.kill(broker.pid, signum)
        error = client.recv("error").error
        assert (error.status, error.fatal) == (pb.STATUS_SHUTTING_DOWN, True)
        client.ended()
        assert broker.terminate(timeout=10) == 0
    assert time.monotonic() - started < 10
    assert "stopped" in broker.output


def test_sigterm_with_a_client_that_does_not_read(broker: BrokerProcess) -> None:
    """A consumer that stopped reading cannot hold the broker up beyond its grace period."""
    uri = unique_uri("stuck")
    stuck = WireClient(broker.address, receive=False)
    try:
        stuck.send_hello()
        limits = pb.QueueOptions(max_unconfirmed_messages=1000, max_unconfirmed_bytes=2**30)
        request = pb.OpenQueue(request_id=1, queue_id=1, uri=uri, read=True, options=limits)
        stuck.send(pb.ClientFrame(open_queue=request))
        with connected(broker.address) as producer:
            producer.open(1, uri, write=True)
            # 64 MB of PUSHes: far more than gRPC and the kernel buffer for a stream, so
            # the broker's writes to the stuck consumer wait on flow control.
            for _ in range(16):
                producer.put(1, [(new_guid(), b"p" * 1_000_000, {}) for _ in range(4)])
            producer.acks(64, timeout=30)
            # The broker still serves others meanwhile.
            assert producer.open(2, unique_uri("others"), write=True).status == pb.STATUS_OK
        started = time.monotonic()
        assert broker.terminate(timeout=20) == 0
        assert time.monotonic() - started < 15
    finally:
        stuck.close()


FROZEN_CONSUMER = """
import sys
from tests.support.wire_client import WireClient
client = WireClient(sys.argv[1])
client.hello()
client.open(1, sys.argv[2], read=True)
client.pushes(3)
print("holding", flush=True)
sys.stdin.read()
"""


@pytest.mark.timeout(60)
def test_a_frozen_consumer_is_noticed_and_its_messages_redelivered(
    shared_broker: BrokerProcess,
) -> None:
    """SIGSTOP keeps the consumer's socket open: only keepalive can tell it is gone."""
    uri = unique_uri("frozen")
    with connected(shared_broker.address) as producer:
        producer.open(1, uri, write=True)
        guids = [new_guid() for _ in range(3)]
        producer.put(1, [(g, b"x", {}) for g in guids])
        producer.acks(3)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    frozen = subprocess.Popen(
        [sys.executable, "-c", FROZEN_CONSUMER, shared_broker.address, uri],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": root},
    )
    try:
        assert frozen.stdout is not None
        assert frozen.stdout.readline() == "holding\n"
        os.kill(frozen.pid, signal.SIGSTOP)
        with connected(shared_broker.address) as consumer:
            consume_options = pb.QueueOptions(
                max_unconfirmed_messages=10, max_unconfirmed_bytes=1000
            )
            consumer.open(1, uri, read=True, options=consume_options)
            again = consumer.pushes(3, timeout=30)
        assert [(p.guid, p.delivery_count) for p in again] == [(g, 2) for g in guids]
    finally:
        frozen.kill()
        frozen.wait(10)


def test_restart_on_the_same_port_after_a_kill(broker: BrokerProcess) -> None:
    port, pid = broker.port, broker.pid
    broker.kill()
    assert broker.returncode == -signal.SIGKILL
    broker.restart()
    assert (broker.port, broker.address) == (port, f"127.0.0.1:{port}")
    assert broker.pid != pid
    with connected(broker.address) as client:
        assert client.open(1, unique_uri("restarted"), write=True).status == pb.STATUS_OK


def test_a_port_in_use_is_an_error(broker: BrokerProcess) -> None:
    second = BrokerProcess(port=broker.port)
    with pytest.raises(RuntimeError, match="exited with 2"):
        second.start()
    assert "cannot listen on" in second.output


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--store", "sqlite3:/tmp/x.db"], "unknown store 'sqlite3:/tmp/x.db'"),
        (["--store", "nowhere"], "unknown store"),
        (["--dedup-window", "0"], "must be > 0"),
        (["--dedup-window", "soon"], "--dedup-window"),
        (["--max-payload-bytes", "-1"], "must be >= 1"),
        (["--listen", "nowhere"], "expected HOST:PORT"),
    ],
)
def test_bad_command_line(args: list[str], complaint: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "holdfast.broker", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert complaint in result.stderr


def test_console_script_help() -> None:
    script = os.path.join(os.path.dirname(sys.executable), "holdfast-broker")
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    for option in ("--listen", "--store", "--dedup-window", "--max-payload-bytes", "--log-level"):
        assert option in result.stdout
