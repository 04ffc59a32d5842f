"""Queue URIs: ``hf://<domain>/<queue>``.

Part of the wire contract, so the SDK can reject a bad URI before it leaves the
process and the broker applies the very same rule to whatever arrives.
"""

from __future__ import annotations

import re
from typing import NamedTuple

SCHEME = "hf"
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_URI = re.compile(rf"^{SCHEME}://(?P<domain>{_NAME})/(?P<queue>{_NAME})$")


class QueueUri(NamedTuple):
    """A parsed queue URI."""

    domain: str
    queue: str

    def __str__(self) -> str:
        return f"{SCHEME}://{self.domain}/{self.queue}"


def parse_queue_uri(uri: str) -> QueueUri:
    """Parse ``hf://<domain>/<queue>``; raise ``ValueError`` saying what is wrong.

    Domain and queue names are 1-128 characters of letters, digits, ``.``, ``_``
    and ``-``, starting with a letter or digit.
    """
    if not isinstance(uri, str):
        raise ValueError(f"queue URI must be a string, not {type(uri).__name__}")
    match = _URI.match(uri)
    if match is None:
        raise ValueError(
            f"invalid queue URI {uri!r}: expected {SCHEME}://<domain>/<queue>, names of "
            "1-128 letters, digits, '.', '_' or '-' starting with a letter or digit"
        )
    return QueueUri(match["domain"], match["queue"])
