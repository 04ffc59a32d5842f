"""The ``holdfast`` command's start-up: connection options before or after the command,
``$HOLDFAST_ADDRESS`` / ``$HOLDFAST_TOKEN`` (and the deprecated
``$HOLDFAST_BROKER_ADDRESS``) for every command, one-line errors with exit code 2 for
every start-up mistake, exit codes for authentication and permission failures, and
silence when the reader of the output goes away."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdfast.admin.cli import EXIT_AUTHENTICATION, EXIT_CLOSED_PIPE, EXIT_PERMISSION
from holdfast.admin.options import DEFAULT_ADDRESS, UsageError, connection, parser
from holdfast.sdk.admin import DEFAULT_TIMEOUT
from tests.support.processes import BrokerProcess

pytestmark = pytest.mark.timeout(60)

URI = "hf://cli/opts"
ADMIN = "admin-token-0001"
WRITER = "writer-token-0001"

# Every admin command, with the arguments it needs.
COMMANDS = [
    ["queues"],
    ["queues", "--json"],
    ["stats", URI],
    ["peek", URI, "-n", "3"],
    ["purge", URI],
    ["policy", "show", URI],
    ["policy", "set", URI, "--ttl", "30"],
    ["dlq", "replay", URI],
    ["delete", URI],
]
GLOBALS = ["--address", "10.1.2.3:99", "--timeout", "4", "--token", "t0k"]


def holdfast(
    *args: str, env: dict[str, str] | None = None, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m holdfast.admin ARGS`` with none of the user's HOLDFAST_*
    variables, plus ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HOLDFAST_")}
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "holdfast.admin", *args],
        capture_output="stdout" not in kwargs,
        text=True,
        timeout=30,
        env={**clean, **(env or {})},
        **kwargs,
    )


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_connection_options_go_before_or_after_the_command(command: list[str]) -> None:
    before = connection(parser().parse_args([*GLOBALS, *command]), environ={})
    after = connection(parser().parse_args([*command, *GLOBALS]), environ={})
    assert before == after
    assert (after.address, after.timeout, after.token) == ("10.1.2.3:99", 4.0, "t0k")
    # After the command wins over before it; a default never overrides either.
    both = parser().parse_args(["--address", "1.1.1.1:1", *command, "--address", "2.2.2.2:2"])
    assert connection(both, environ={}).address == "2.2.2.2:2"
    only_before = parser().parse_args(["--tls-ca", "/x", *command])
    assert only_before.tls_ca == "/x" and only_before.address is None


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_the_environment_names_the_broker_and_the_token_for_every_command(
    command: list[str],
) -> None:
    args = parser().parse_args(command)
    assert connection(args, environ={}) == connection(args, environ={"HOLDFAST_ADDRESS": ""})
    default = connection(args, environ={})
    assert (default.address, default.timeout, default.token) == (
        DEFAULT_ADDRESS,
        DEFAULT_TIMEOUT,
        None,
    )
    env = {"HOLDFAST_ADDRESS": "10.0.0.1:7700", "HOLDFAST_TOKEN": "from-env"}
    settings = connection(args, environ=env)
    assert (settings.address, settings.token, settings.warnings) == (
        "10.0.0.1:7700",
        "from-env",
        (),
    )
    flags = connection(parser().parse_args([*command, *GLOBALS]), environ=env)
    assert (flags.address, flags.token) == ("10.1.2.3:99", "t0k")
    old = connection(args, environ={"HOLDFAST_BROKER_ADDRESS": "10.0.0.2:7700"})
    assert old.address == "10.0.0.2:7700"
    assert old.warnings == (
        "holdfast: warning: $HOLDFAST_BROKER_ADDRESS is deprecated, set $HOLDFAST_ADDRESS instead",
    )
    both = {"HOLDFAST_BROKER_ADDRESS": "10.0.0.2:7700", "HOLDFAST_ADDRESS": "10.0.0.1:7700"}
    assert connection(args, environ=both).address == "10.0.0.1:7700"
    assert not connection(args, environ=both).warnings


def test_a_bad_address_from_the_environment_names_the_variable() -> None:
    args = parser().parse_args(["queues"])
    with pytest.raises(UsageError, match=r"^\$HOLDFAST_ADDRESS: expected HOST:PORT, got 'x'$"):
        connection(args, environ={"HOLDFAST_ADDRESS": "x"})


@pytest.fixture
def not_pem(tmp_path: Path) -> str:
    path = tmp_path / "ca.txt"
    path.write_text("not a certificate\n")
    return str(path)


@pytest.mark.parametrize(
    ("args", "env", "text"),
    [
        ((), {}, "holdfast: error: the following arguments are required: COMMAND"),
        (("queues", "--bogus"), {}, "holdfast: error: unrecognized arguments: --bogus"),
        (("frobnicate",), {}, "holdfast: error: argument COMMAND: invalid choice: 'frobnicate'"),
        (("stats",), {}, "holdfast stats: error: the following arguments are required: uri"),
        (("policy",), {}, "holdfast policy: error: the following arguments are required"),
        (("peek", URI, "-n", "x"), {}, "argument -n: invalid int value: 'x'"),
        (("queues", "--timeout", "0"), {}, "argument --timeout: must be more than 0 and at"),
        # gRPC made these a deadline already past: DEADLINE_EXCEEDED, exit 3.
        (("queues", "--timeout", "inf"), {}, "at most 86400 seconds, got inf"),
        (("queues", "--timeout", "1e300"), {}, "at most 86400 seconds, got 1e300"),
        (("queues", "--timeout", "nan"), {}, "argument --timeout: must be more than 0"),
        (("queues", "--timeout", "soon"), {}, "expected a number of seconds, got 'soon'"),
        (("queues", "--address", "nowhere"), {}, "--address: expected HOST:PORT"),
        (("queues", "--address", "http://h:1"), {}, "--address: address 'http://h:1' has a URL"),
        (("policy", "set", URI, "--max-deliveries", "-1"), {}, "argument --max-deliveries: must"),
        (
            ("policy", "set", URI, "--max-bytes", "-1"),
            {},
            "argument --max-bytes: must be >= 0 (0 clears it)",
        ),
        (
            ("policy", "set", URI, "--max-bytes", str(2**64)),
            {},
            "argument --max-bytes: must be <= 18446744073709551615",
        ),
        (
            ("policy", "set", URI, "--max-deliveries", str(2**32)),
            {},
            "argument --max-deliveries: must be <= 4294967295",
        ),
        (("policy", "set", URI, "--ttl", "-5"), {}, "argument --ttl: must be in (0, 315360000]"),
        (("queues",), {"HOLDFAST_ADDRESS": "a:b"}, "$HOLDFAST_ADDRESS: expected HOST:PORT"),
        (("queues",), {"HOLDFAST_BROKER_ADDRESS": "a:b"}, "$HOLDFAST_BROKER_ADDRESS: expected"),
        (("queues", "--tls-cert", "c.pem"), {}, "--tls-cert and --tls-key go together"),
        (("queues", "--tls-ca", "/no/such.pem"), {}, "--tls-ca /no/such.pem: No such file"),
        (("queues", "--tls-ca", "NOT_PEM"), {}, "not a PEM file"),
        (("queues", "--token", "t\u00e9"), {}, "--token: a token is printable ASCII"),
        (("queues",), {"HOLDFAST_TOKEN": "a\nb"}, "$HOLDFAST_TOKEN: a token is printable"),
    ],
)
def test_every_start_up_mistake_is_one_line_and_exit_code_2(
    args: tuple[str, ...], env: dict[str, str], text: str, not_pem: str
) -> None:
    done = holdfast(*(not_pem if arg == "NOT_PEM" else arg for arg in args), env=env)
    lines = [line for line in done.stderr.splitlines() if "deprecated" not in line]
    assert (done.returncode, len(lines), done.stdout) == (2, 1, ""), done.stderr
    assert text in lines[0]
    assert "Traceback" not in done.stderr


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with tokens: one admin, one that may only write."""
    tokens = [
        {"token": ADMIN, "name": "ops", "read": ["*"], "write": ["*"], "admin": True},
        {"token": WRITER, "name": "app", "read": ["cli"], "write": ["cli"], "admin": False},
    ]
    path = tmp_path_factory.mktemp("auth") / "tokens.json"
    path.write_text(json.dumps({"tokens": tokens}))
    with BrokerProcess(["--auth-file", str(path)]) as broker:
        yield broker


def test_every_command_runs_from_the_environment_alone(auth_broker: BrokerProcess) -> None:
    env = {"HOLDFAST_ADDRESS": auth_broker.address, "HOLDFAST_TOKEN": ADMIN}
    for command in [["policy", "set", URI, "--max-deliveries", "3"], *COMMANDS]:
        done = holdfast(*command, env=env)
        assert (done.returncode, done.stderr) == (0, ""), (command, done.stderr)
    # The flags after the command, nothing from the environment.
    done = holdfast("queues", "--address", auth_broker.address, "--token", ADMIN)
    assert (done.returncode, done.stderr) == (0, "")
    # The deprecated name still works, with a warning.
    env = {"HOLDFAST_BROKER_ADDRESS": auth_broker.address, "HOLDFAST_TOKEN": ADMIN}
    done = holdfast("queues", env=env)
    assert done.returncode == 0
    assert done.stderr == (
        "holdfast: warning: $HOLDFAST_BROKER_ADDRESS is deprecated, set $HOLDFAST_ADDRESS instead\n"
    )


@pytest.mark.parametrize(
    ("token", "code", "text"),
    [
        (None, EXIT_AUTHENTICATION, "a token is required"),
        ("no-such-token-00", EXIT_AUTHENTICATION, "the token is not valid"),
        (WRITER, EXIT_PERMISSION, "PERMISSION_DENIED"),
    ],
)
def test_authentication_and_permission_failures_have_their_own_exit_codes(
    auth_broker: BrokerProcess, token: str | None, code: int, text: str
) -> None:
    env = {"HOLDFAST_ADDRESS": auth_broker.address}
    if token is not None:
        env["HOLDFAST_TOKEN"] = token
    done = holdfast("queues", env=env)
    assert done.returncode == code, done.stderr
    assert done.stderr.count("\n") == 1 and text in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_closed_pipe_ends_the_command_quietly(auth_broker: BrokerProcess) -> None:
    env = {"HOLDFAST_ADDRESS": auth_broker.address, "HOLDFAST_TOKEN": ADMIN}
    holdfast("policy", "set", URI, "--ttl", "5", env=env)
    # The reader is gone before the first write: exactly what `| head -1` does to a
    # long listing.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = holdfast("queues", env=env, stdout=write_end, stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (EXIT_CLOSED_PIPE, "")
    # And through a shell, as people type it: head's line, no traceback, 0 or 141.
    shell = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m holdfast.admin queues | head -1; '
         'echo "status=${PIPESTATUS[0]}"'],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **env},
    )  # fmt: skip
    lines = shell.stdout.splitlines()
    assert lines[0].split()[0] == "URI" and lines[1] in ("status=0", "status=141")
    assert shell.stderr == ""


def test_help_lists_every_exit_code() -> None:
    import re

    from holdfast.admin import cli
    from holdfast.admin.options import EXIT_CODES_HELP

    codes = {value for name, value in vars(cli).items() if name.startswith("EXIT_")}
    assert {int(n) for n in re.findall(r"(?<![\w(])(\d+) [a-z]", EXIT_CODES_HELP)} == codes
    assert EXIT_CODES_HELP in parser().format_help()
