"""Keyed worker pools against a real broker (issue #16): groups start on the first
request for a key, stop when idle in two stages without losing a request, poison
requests end in the pool's poison queue with a typed error for the caller, and two
managers on one pool do no harm."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from holdfast.sdk import DeadLetteredError, Session
from holdfast.sdk.admin import AdminClient
from holdfast.sdk.poolnames import PoolNames
from tests.pools.support import WORKER, alive, running_manager, start_manager, stop, who
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

POOL = "hf://infra/sim"


def test_the_first_request_for_a_key_starts_its_group_and_later_ones_reuse_it(
    broker: BrokerProcess,
) -> None:
    with (
        running_manager(broker.address, POOL) as manager,
        Session(broker.address, options=FAST) as session,
    ):
        key, worker, pid, payload = who(session.request(POOL, b"a", key="42", timeout=60))
        assert (key, payload) == ("42", b"a")
        assert worker.startswith("sim-")
        again = who(session.request(POOL, b"b", key="42", timeout=30))
        assert again[2] == pid  # the same group
        other = who(session.request(POOL, b"c", key="43", timeout=60))
        assert other[0] == "43" and other[2] != pid
        assert manager.orphans.forwarded == 2  # one orphan per key, the rest direct
        # A key is data: spaces, quotes and shell syntax reach the worker unchanged.
        odd = "x $(rm -rf /); ../../etc 'é' \"\n"
        assert who(session.request(POOL, b"d", key=odd, timeout=60))[0] == odd


def test_an_idle_key_unbinds_then_stops_and_a_later_request_starts_it_again(
    broker: BrokerProcess,
) -> None:
    names = PoolNames.of(POOL)
    with (
        running_manager(broker.address, POOL, unbind_delay=1.0, stop_delay=1.0),
        Session(broker.address, options=FAST) as session,
        AdminClient(broker.address) as admin,
    ):
        first = who(session.request(POOL, b"a", key="7", timeout=60))
        queue = names.key_queue("7")
        assert admin.policy(queue).redirect is None  # bound
        wait_until(lambda: admin.policy(queue).redirect == names.orphans, 10, "the unbind")
        assert alive(first[2])  # unbound, not stopped yet: the group still runs
        # A request in between goes the orphan way and is served: never lost.
        between = who(session.request(POOL, b"b", key="7", timeout=60))
        assert between[3] == b"b"
        wait_until(lambda: not alive(between[2]), 20, "the group to stop")
        later = who(session.request(POOL, b"c", key="7", timeout=60))
        assert later[3] == b"c" and later[2] != between[2]


def test_a_request_that_crashes_its_workers_lands_in_the_poison_queue(
    broker: BrokerProcess,
) -> None:
    names = PoolNames.of(POOL)
    with (
        running_manager(broker.address, POOL, max_deliveries=2) as manager,
        Session(broker.address, options=FAST) as session,
        AdminClient(broker.address) as admin,
    ):
        with pytest.raises(DeadLetteredError) as caught:
            session.request(POOL, b"crash", key="9", timeout=60)
        assert caught.value.reason == "delivery-limit"
        (poison,) = admin.peek(names.poison)
        assert poison.payload == b"crash"
        assert poison.properties["x-death-reason"] == "delivery-limit"
        # The group was restarted after each crash and still serves the key.
        assert who(session.request(POOL, b"fine", key="9", timeout=60))[3] == b"fine"
        assert manager.supervisor.starts >= 3


def test_two_managers_on_one_pool_one_active_and_the_other_takes_over(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    command = [
        sys.executable,
        "-m",
        "holdfast.pool",
        "--address",
        broker.address,
        "--pool",
        POOL,
        "--worker-command",
        " ".join(WORKER),
    ]
    first = start_manager(command, tmp_path / "first.log")
    second = start_manager(command, tmp_path / "second.log")
    workers: list[int] = []
    try:
        with Session(broker.address, options=FAST) as session:
            served = who(session.request(POOL, b"a", key="1", timeout=60))
            assert served[3] == b"a"
            workers.append(served[2])
            logs = [(tmp_path / name).read_bytes() for name in ("first.log", "second.log")]
            assert sum(b"this manager is the active one" in log for log in logs) == 1
            # SIGKILL the active one: the other takes the token and serves the next key.
            active, standby = (first, second) if b"active one" in logs[0] else (second, first)
            active.send_signal(signal.SIGKILL)
            active.wait(10)
            # Its worker dies with it (parent-death signal): no orphan keeps serving.
            wait_until(lambda: not alive(served[2]), 10, "the killed manager's worker to die")
            again = who(session.request(POOL, b"b", key="1", timeout=60))
            workers.append(again[2])
            assert again[3] == b"b" and again[2] != served[2]
            assert standby.poll() is None
    finally:
        for process in (first, second):
            stop(process)
        for pid in workers:  # only if an assertion failed before they died
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_the_noop_driver_serves_workers_started_by_hand(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    names = PoolNames.of(POOL)
    command = [
        sys.executable, "-m", "holdfast.pool", "--address", broker.address,
        "--pool", POOL, "--driver", "noop",
    ]  # fmt: skip
    manager = start_manager(command, tmp_path / "manager.log")
    environment = {
        **os.environ,
        "WORKER_ID": "by-hand",
        "WORKER_KEY": "5",
        "WORKER_POOL": POOL,
        "WORKER_REQUESTS_QUEUE": names.key_queue("5"),
        "HOLDFAST_ADDRESS": broker.address,
    }
    worker = subprocess.Popen(WORKER, env=environment, start_new_session=True)
    try:
        with Session(broker.address, options=FAST) as session:
            assert who(session.request(POOL, b"x", key="5", timeout=60))[:2] == ("5", "by-hand")
    finally:
        for process in (worker, manager):
            stop(process)
    assert manager.returncode == 0


def test_bad_command_lines_are_one_line_errors() -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "holdfast.pool", *args],
            capture_output=True,
            text=True,
            timeout=30,
        )

    done = run("--address", "127.0.0.1:1", "--pool", POOL)
    assert done.returncode == 2 and "--worker-command is required" in done.stderr
    done = run("--address", "nowhere", "--pool", POOL, "--driver", "noop")
    assert done.returncode == 2 and "--address" in done.stderr
    done = run("--address", "127.0.0.1:1", "--pool", "hf://bad pool", "--driver", "noop")
    assert done.returncode == 2 and "invalid queue URI" in done.stderr
    # A URI with a scheme is quoted as typed: only a bare <domain>/<pool> gets hf://.
    done = run("--address", "127.0.0.1:1", "--pool", "hf:/infra/sim", "--driver", "noop")
    assert done.returncode == 2 and "--pool: invalid queue URI 'hf:/infra/sim'" in done.stderr
    done = run("--address", "127.0.0.1:1", "--pool", "hf://infra/sim.key-zz", "--driver", "noop")
    assert done.returncode == 2 and "--pool: pool name 'sim.key-zz' holds '.key-'" in done.stderr
    done = run("--address", "127.0.0.1:1", "--pool", POOL, "--processing-timeout", "0")
    assert done.returncode == 2 and "--processing-timeout" in done.stderr
    # Start-up failures name the flag to look at, in one line, exit code 2.
    done = run("--address", "127.0.0.1:1", "--pool", POOL, "--worker-command", "true")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    # Nothing started, so nothing is reported stopping: the error is the only line.
    (line,) = done.stderr.splitlines()
    assert line.startswith("holdfast-pool: cannot start: --address 127.0.0.1:1")
    assert "--admin-address" in line
    done = run(
        "--address", "127.0.0.1:1", "--admin-address", "127.0.0.1:2", "--pool", POOL,
        "--driver", "noop",
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "cannot start: --admin-address 127.0.0.1:2: UNAVAILABLE" in done.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--unbind-delay", "abc"], "--unbind-delay"),
        (["--unbind-delay", "nan"], "--unbind-delay"),
        (["--stop-delay", "-1"], "--stop-delay"),
        (["--tls-ca", "/nonexistent.pem"], "--tls-ca"),
        (["--worker-command", "'unbalanced"], "--worker-command"),
    ],
)
def test_each_bad_flag_is_one_line_naming_it(args: list[str], named: str) -> None:
    base = ["--address", "127.0.0.1:1", "--pool", POOL, "--worker-command", "true"]
    done = subprocess.run(
        [sys.executable, "-m", "holdfast.pool", *base, *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("holdfast-pool:") and named in line


def test_a_start_against_a_proxy_is_one_line_without_the_session_s_events(
    broker: BrokerProcess,
) -> None:
    # The session connects to the proxy before the admin call finds no admin service
    # there: its Connected event is not logged ahead of the failure.
    with ProxyProcess(["--upstream", broker.address]) as proxy:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "holdfast.pool", "--address", proxy.address),
                *("--pool", POOL, "--driver", "noop"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "does not serve the admin service (is it a proxy?)" in line
