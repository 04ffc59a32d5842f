"""The servers' command lines, as a new operator meets them: environment variables,
JSON logs, and one clear line for each mistake, naming the flag or the port."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdfast.broker import cli as broker_cli
from holdfast.proxy import cli as proxy_cli

pytestmark = pytest.mark.timeout(60)

LIMIT_FIELDS = (
    "max_open_queues",
    "new_queues_per_minute",
    "frames_per_second",
    "confirm_errors_per_second",
)


def run(
    program: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    module = "holdfast.broker.cli" if program == "broker" else "holdfast.proxy.cli"
    code = f"import sys, {module} as m; sys.exit(m.main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_every_flag_has_an_environment_variable_and_the_flag_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HOLDFAST_DEDUP_WINDOW", "7")
    monkeypatch.setenv("HOLDFAST_STORE", "memory")
    parser = broker_cli.build_parser()
    assert parser.parse_args([]).dedup_window == 7.0
    assert parser.parse_args(["--dedup-window", "9"]).dedup_window == 9.0
    monkeypatch.setenv("HOLDFAST_UPSTREAM", "127.0.0.1:7799")
    assert proxy_cli.build_parser().parse_args([]).upstream == "127.0.0.1:7799"
    for parser in (broker_cli.build_parser(), proxy_cli.build_parser()):
        for action in parser._actions:
            if action.option_strings and action.dest not in ("help", "version"):
                assert "[env HOLDFAST_" in (action.help or ""), action.option_strings


def test_a_bad_environment_value_names_the_flag() -> None:
    done = run("broker", env={"HOLDFAST_DEDUP_WINDOW": "abc", "PATH": ""})
    assert done.returncode == 2
    assert "--dedup-window" in done.stderr


@pytest.mark.parametrize("program", ["broker", "proxy"])
def test_a_listen_port_in_use_is_one_line_naming_it(program: str, taken_port: int) -> None:
    args = ["--listen", f"127.0.0.1:{taken_port}"]
    if program == "proxy":
        args += ["--upstream", "127.0.0.1:1"]
    done = run(program, *args)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line or "add_port" in line]
    assert len(errors) == 1, done.stderr
    # Nothing was started, so nothing is stopped: the error is the only line.
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{taken_port} (--listen): the port is in use" in errors[0]


def test_a_metrics_port_in_use_is_reported_before_listening_and_names_it(taken_port: int) -> None:
    done = run("broker", "--listen", "127.0.0.1:0", "--metrics-port", str(taken_port))
    assert done.returncode == 2, done.stderr
    assert "(--metrics-port): the port is in use" in done.stderr
    assert "listening on" not in done.stderr


def test_proxy_option_errors_name_the_flags() -> None:
    done = run("proxy", "--keepalive", "0", "--upstream", "127.0.0.1:1")
    assert done.returncode == 2
    assert "--keepalive must be > 0" in done.stderr
    assert "keepalive_time" not in done.stderr


@pytest.mark.parametrize("program", ["broker", "proxy"])
@pytest.mark.parametrize(
    ("args", "env", "text"),
    [
        (("--max-open-queues", "0"), {}, "argument --max-open-queues: must be >= 1, got 0"),
        (("--new-queues-per-minute", "0"), {}, "argument --new-queues-per-minute: must be >= 1"),
        (("--frames-per-second", "0"), {}, "argument --frames-per-second: must be >= 1"),
        (("--confirm-errors-per-second", "-1"), {}, "--confirm-errors-per-second: must be >= 1"),
        ((), {"HOLDFAST_MAX_OPEN_QUEUES": "0"}, "argument --max-open-queues: must be >= 1"),
        (("--listen", "http://127.0.0.1:0"), {}, "'http://127.0.0.1:0' has a URL scheme: give"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_flag_and_exit_code_2(
    program: str, args: tuple[str, ...], env: dict[str, str], text: str
) -> None:
    upstream = ("--upstream", "127.0.0.1:1") if program == "proxy" else ()
    done = run(program, *args, *upstream, env={"PATH": "", **env})
    assert (done.returncode, len(done.stderr.strip().splitlines())) == (2, 1), done.stderr
    assert text in done.stderr
    # The flag, never the field behind it (max_open_queues).
    assert not any(field in done.stderr for field in LIMIT_FIELDS), done.stderr


def test_json_logs_are_one_object_a_line(taken_port: int) -> None:
    done = run("broker", "--log-format", "json", "--listen", f"127.0.0.1:{taken_port}")
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert lines and all({"time", "level", "logger", "message"} <= set(e) for e in lines)
    assert any(e["level"] == "ERROR" and "--listen" in e["message"] for e in lines)


@pytest.mark.parametrize(
    ("args", "env", "text"),
    [
        # inf overflowed the lease keeper's timer: 5,660 tracebacks in 15 s, no exit.
        (
            ("--redis-lease", "inf"),
            {},
            "argument --redis-lease: must be >= 0.3 and at most 3600 seconds, got inf",
        ),
        (
            ("--redis-lease", "1e12"),
            {},
            "argument --redis-lease: must be >= 0.3 and at most 3600 seconds",
        ),
        # Help said > 0 while the configuration refused it as "redis_lease must be >= 0.3".
        (
            ("--redis-lease", "0.2"),
            {},
            "argument --redis-lease: must be >= 0.3 and at most 3600 seconds, got 0.2",
        ),
        (
            ("--redis-retry", "inf"),
            {},
            "argument --redis-retry: must be > 0 and at most 3600 seconds",
        ),
        (
            ("--redis-retry", "1e300"),
            {},
            "argument --redis-retry: must be > 0 and at most 3600 seconds",
        ),
        # Past a 64-bit integer every PUT's WAIT failed: nothing was ever ACKed SUCCESS.
        (
            ("--redis-min-replicas", "100000000000000000000"),
            {},
            "argument --redis-min-replicas: must be <= 10000, got 100000000000000000000",
        ),
        (
            (),
            {"HOLDFAST_SYNC": "fast"},
            "argument --sync: must be one of full, normal, got 'fast' (from HOLDFAST_SYNC)",
        ),
        (
            (),
            {"HOLDFAST_REDIS_LEASE": "inf"},
            "argument --redis-lease: must be >= 0.3 and at most 3600 seconds, got inf "
            "(from HOLDFAST_REDIS_LEASE)",
        ),
        # Read while the parser was built, a bad one was a traceback, even with the flag
        # given or --help.
        (
            (),
            {"HOLDFAST_HISTORY_MAX_GUIDS": "abc"},
            "argument --history-max-guids: invalid literal for int() with base 10: 'abc' "
            "(from HOLDFAST_HISTORY_MAX_GUIDS)",
        ),
        (
            (),
            {"HOLDFAST_HISTORY_MAX_GUIDS": "0"},
            "argument --history-max-guids: must be > 0, got 0 (from HOLDFAST_HISTORY_MAX_GUIDS)",
        ),
        (
            ("--store", "sqllite:x.db"),
            {},
            "redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]",
        ),
        (
            ("--store", "mongodb://admin:hunter2@db:1"),
            {},
            "unknown store 'mongodb://***@db:1'",
        ),
    ],
)
def test_a_bad_broker_value_is_one_line_naming_the_flag(
    args: tuple[str, ...], env: dict[str, str], text: str
) -> None:
    done = run("broker", "--listen", "127.0.0.1:0", *args, env={"PATH": "", **env})
    assert (done.returncode, len(done.stderr.strip().splitlines())) == (2, 1), done.stderr
    assert text in done.stderr
    assert "hunter2" not in done.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--redis-min-replicas", "2"), "--redis-min-replicas: only for a Redis store"),
        (("--redis-lease", "5", "--redis-retry", "9"), "--redis-retry, --redis-lease: only for"),
        (("--store", "sqlite:{tmp}/b.db", "--redis-min-replicas", "1"), "not sqlite"),
    ],
)
def test_redis_flags_without_a_redis_store_are_refused(
    args: tuple[str, ...], named: str, tmp_path: Path
) -> None:
    """--redis-min-replicas with --store memory was taken and did nothing, while
    --redis-ca with sqlite was refused: every Redis flag is refused alike."""
    done = run("broker", "--listen", "127.0.0.1:0", *(a.format(tmp=tmp_path) for a in args))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert named in line and "invalid configuration" in line
    assert "listening on" not in done.stderr
