"""Mistakes in TLS and proxy settings named at once, in one line: a file that is not
PEM, an expired client certificate (not taken for one from another CA), and each bad
proxy flag by its own name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from holdfast.proto.tls_failures import SERVER_FAILURES, name_failure
from holdfast.sdk import InvalidArgumentError
from holdfast.sdk.credentials import channel_credentials


def test_a_ca_file_that_is_not_pem_is_refused_before_any_connection(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(InvalidArgumentError, match=r"tls_ca .*ca\.pem: not a PEM file"):
        channel_credentials(str(ca))


def test_an_expired_client_certificate_is_named_as_expired() -> None:
    logged = (
        "Handshake failed with fatal error SSL_ERROR_SSL: error:1000007d:SSL routines:"
        "OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: certificate has expired"
    )
    assert name_failure(logged, SERVER_FAILURES) == (
        "TLS handshake failed: a client's certificate has expired"
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--listen", "nope"], "--listen:"),
        (["--metrics-listen", "nope"], "--metrics-listen:"),
        (["--upstream", "nope"], "--upstream:"),
        (["--upstream-ca", "/etc/passwd"], "--upstream-ca /etc/passwd: not a PEM file"),
        (["--upstream-cert", "/etc/passwd"], "--upstream-cert and --upstream-key"),
        (["--reconnect-max", "0"], "--reconnect-max must be > 0"),
        (["--max-buffer-bytes", "abc"], "--max-buffer-bytes"),
        (["--max-buffer-bytes", "99999999999999999999"], "--max-buffer-bytes: must be <="),
        # Checked with the configuration, the variable went unnamed.
        (["HOLDFAST_MAX_BUFFER_BYTES=0"], "got 0 (from HOLDFAST_MAX_BUFFER_BYTES)"),
    ],
)
def test_each_bad_proxy_flag_is_one_line_naming_it(args: list[str], named: str) -> None:
    env = dict(os.environ)
    if args and "=" in args[0] and not args[0].startswith("-"):
        name, value = args.pop(0).split("=", 1)
        env[name] = value
    done = subprocess.run(
        [sys.executable, "-m", "holdfast.proxy", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert named in line
