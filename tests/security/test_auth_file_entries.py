"""Auth-file entries that could never match a client are refused at start-up.

A domain written as a URI (``"hf://a"``) or with a space is compared with a queue's
domain and never equals one; a token that is not printable ASCII, or has a space, is
one no client can send (gRPC metadata cannot carry it). Both were accepted: a grant
that silently grants nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from holdfast.server.auth import AuthFileError, Authorizer

pytestmark = pytest.mark.timeout(60)

TOKEN = "tok-aaaaaaaaaaaa"


def entry(**fields: Any) -> dict[str, Any]:
    return {"tokens": [{"token": TOKEN, "name": "n", "read": ["a"], "write": ["a"], **fields}]}


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"read": ["hf://a"]}, "tokens[0]: read: 'hf://a' is not a domain name"),
        ({"write": ["a b"]}, "tokens[0]: write: 'a b' is not a domain name"),
        ({"write": ["-a"]}, "tokens[0]: write: '-a' is not a domain name"),
        ({"read": ["x" * 129]}, "is not a domain name"),
        ({"token": "tok\u00e9aaaaaaaa"}, "tokens[0]: token: a token is printable ASCII"),
        ({"token": "tok aaaaaaaaaa"}, "tokens[0]: token: a token is printable ASCII"),
        ({"token": "tok\taaaaaaaaaa"}, "tokens[0]: token: a token is printable ASCII"),
    ],
)
def test_an_entry_that_can_never_match_is_refused_naming_it(
    fields: dict[str, Any], text: str
) -> None:
    with pytest.raises(AuthFileError) as refused:
        Authorizer.from_json(entry(**fields), "auth.json")
    assert str(refused.value).startswith("auth.json: ")
    assert text in str(refused.value)
    assert "\u00e9" not in str(refused.value)  # a token is never quoted


def test_domain_names_and_every_domain_are_taken() -> None:
    authorizer = Authorizer.from_json(entry(read=["*"], write=["orders", "a.b_c-9"]))
    grant = authorizer.authenticate(TOKEN)
    assert grant is not None and grant.can_read("x") and grant.can_write("a.b_c-9")


@pytest.mark.parametrize("program", ["holdfast.broker", "holdfast.proxy"])
def test_the_servers_refuse_it_in_one_line(program: str, tmp_path: Path) -> None:
    path = tmp_path / "auth.json"
    path.write_text(json.dumps(entry(read=["hf://a"])))
    done = subprocess.run(
        [sys.executable, "-m", program, "--listen", "127.0.0.1:0", "--auth-file", str(path)]
        + (["--upstream", "127.0.0.1:1"] if program == "holdfast.proxy" else []),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert f"--auth-file: {path}: tokens[0]: read: 'hf://a' is not a domain name" in line
