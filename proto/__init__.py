"""The Holdfast wire contract (``holdfast.v1``) and the code every peer shares.

``holdfast.proto`` is the source; ``holdfast_pb2.py`` (and its ``.pyi``) are
generated from it by ``python -m holdfast.proto.generate`` and checked in.
``PROTOCOL_VERSION`` is the version a client announces in ``Hello`` and a broker
accepts. This package holds the wire and nothing else; the SDK, the proxy and the
broker share from it:

- ``limits``: the limits' defaults, the ``Limits`` value, the HelloReply;
- ``validate``: queue URI, open, PUT and property checks, bounded quoting;
- ``credentials``: how a token travels (gRPC metadata);
- ``policy``: queue policy values (limits, TTL, dead letters) for the broker and the admin client.
- ``logs``: the library's top-level logger ``holdfast`` and its ``NullHandler``.

The server shell the broker and the proxy share (a served session stream, its outbox,
the guard, TLS, signals, the metrics endpoint) lives in ``holdfast.server``.

The contract's rules are described in ``docs/contract.md``.
"""

from holdfast.proto import holdfast_pb2 as pb
from holdfast.proto.logs import quiet_library_logger

quiet_library_logger()

PROTOCOL_VERSION = 3
"""The protocol version this code speaks."""

SERVICE_NAME = "holdfast.v1.Broker"
SESSION_METHOD = f"/{SERVICE_NAME}/Session"
"""The full gRPC method name of the session stream."""
COMMIT_MARK = "CommitMark"
COMMIT_MARK_METHOD = f"/{SERVICE_NAME}/{COMMIT_MARK}"
"""The unary call that reads and records commit marks (``holdfast.broker.marks``)."""
STAGING = "Staging"
STAGING_METHOD = f"/{SERVICE_NAME}/{STAGING}"
"""The unary call of transactional writes: stage, commit, abort (``broker.staging``)."""
NO_BROKER = "the proxy reaches no broker: "
"""How a proxy's refusal of a session starts (gRPC ``UNAVAILABLE`` details) when it
cannot reach any broker: the SDK fails a queue's first open at once with the rest."""
ADMIN_SERVICE = "holdfast.v1.Admin"
"""The gRPC service of the admin calls (the broker serves it; ``holdfast`` calls it)."""


def status_name(status: int) -> str:
    """A wire status without its ``STATUS_`` prefix (``pb.STATUS_OK`` -> ``"OK"``); a
    number this code does not know as ``"STATUS_<number>"``."""
    try:
        return pb.Status.Name(status).removeprefix("STATUS_")
    except ValueError:
        return f"STATUS_{status}"


__all__ = [
    "ADMIN_SERVICE",
    "COMMIT_MARK",
    "COMMIT_MARK_METHOD",
    "PROTOCOL_VERSION",
    "SERVICE_NAME",
    "SESSION_METHOD",
    "STAGING",
    "STAGING_METHOD",
    "pb",
    "status_name",
]
