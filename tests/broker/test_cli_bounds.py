"""Values no server can use, refused at start-up in one line naming the flag, exit 2.

Each was accepted before and failed later: ``--dedup-window inf`` with a traceback,
``--dedup-window 1e20`` in every client's session ("Value out of range"), the proxy's
``--keepalive inf`` in an endless loop of failed upstream connections, a token no
client can send with seven lines of gRPC's own log blaming ``--address``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

MODULES = {"broker": "holdfast.broker", "proxy": "holdfast.proxy", "pool": "holdfast.pool"}


def run(program: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """Exit code and stderr lines of a server that must refuse to start (bounded: one
    that starts is killed by the timeout and fails the test)."""
    done = subprocess.run(
        [sys.executable, "-m", MODULES[program], *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "", "GRPC_VERBOSITY": "ERROR", **(env or {})},
    )
    return done.returncode, done.stderr.strip().splitlines()


BROKER = ("--listen", "127.0.0.1:0")
PROXY = ("--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1")
POOL = ("--address", "127.0.0.1:1", "--pool", "hf://d/p", "--worker-command", "true")


@pytest.mark.parametrize(
    ("program", "args", "env", "text"),
    [
        ("broker", ("--dedup-window", "inf"), {}, "argument --dedup-window: must be > 0 and at"),
        ("broker", ("--dedup-window", "1e20"), {}, "at most 2592000 seconds, got 1e20"),
        ("broker", (), {"HOLDFAST_DEDUP_WINDOW": "inf"}, "argument --dedup-window: must be"),
        ("broker", ("--dedup-grace", "inf"), {}, "argument --dedup-grace: must be >= 0 and at"),
        (
            "broker",
            ("--redis-retry", "1e300"),
            {},
            "argument --redis-retry: must be > 0 and at most 3600",
        ),
        ("broker", ("--stage-retention", "inf"), {}, "argument --stage-retention: must be > 0"),
        ("broker", ("--hello-timeout", "0"), {}, "argument --hello-timeout: must be > 0"),
        ("proxy", ("--hello-timeout", "inf"), {}, "argument --hello-timeout: must be > 0"),
        (
            "broker",
            ("--max-payload-bytes", str(2**40)),
            {},
            "argument --max-payload-bytes: must be <= 58653632",
        ),
        ("broker", ("--listen", "0.0.0.300:0"), {}, "cannot listen on 0.0.0.300:0 (--listen): "),
        ("proxy", ("--keepalive", "inf"), {}, "--keepalive must be > 0 and at most 86400 seconds"),
        ("proxy", ("--keepalive", "1e300"), {}, "--keepalive must be > 0 and at most 86400"),
        ("proxy", ("--keepalive-timeout", "inf"), {}, "--keepalive-timeout must be > 0 and at"),
        ("proxy", ("--reconnect-max", "1e300"), {}, "--reconnect-max must be > 0"),
        (
            "proxy",
            (),
            {"HOLDFAST_UPSTREAM_TOKEN": "t\u00e9-token"},
            "$HOLDFAST_UPSTREAM_TOKEN: a token is printable ASCII without spaces",
        ),
        ("pool", ("--token", "t\u00e9-token"), {}, "--token: a token is printable ASCII"),
        ("pool", ("--token", "a\nb"), {}, "--token: a token is printable ASCII"),
        (
            "pool",
            (),
            {"HOLDFAST_TOKEN": "t\u00e9-token"},
            "$HOLDFAST_TOKEN: a token is printable ASCII",
        ),
    ],
)
def test_a_value_no_server_can_use_is_one_line_naming_it(
    program: str, args: tuple[str, ...], env: dict[str, str], text: str
) -> None:
    fixed = {"broker": BROKER, "proxy": PROXY, "pool": POOL}[program]
    code, lines = run(program, *fixed, *args, env=env)
    assert (code, len(lines)) == (2, 1), lines
    assert text in lines[0]
    # Flags, never the fields behind them.
    fields = ("keepalive_time", "keepalive_timeout", "dedup_window", "max_payload_bytes")
    assert not any(field in lines[0] for field in fields), lines


@pytest.mark.parametrize(
    ("content", "text"),
    [
        (b"t\xe9-token\n", "not UTF-8 text (a token is printable ASCII without spaces)"),
        ("t\u00e9-token\n".encode(), "a token is printable ASCII without spaces"),
        (b"tok with space\n", "a token is printable ASCII without spaces"),
    ],
)
def test_an_upstream_token_file_no_broker_could_read_names_the_flag(
    tmp_path: Path, content: bytes, text: str
) -> None:
    path = tmp_path / "token"
    path.write_bytes(content)
    code, lines = run("proxy", *PROXY, "--upstream-token-file", str(path))
    assert (code, len(lines)) == (2, 1), lines
    assert f"--upstream-token-file {path}: {text}" in lines[0]
    assert "codec" not in lines[0]
