"""A server's security settings: TLS on its listener, its token file, its limits.

Shared by the broker and the proxy (``--tls-cert``, ``--tls-key``,
``--tls-client-ca``, ``--auth-file`` and the limit flags, added to both command lines
by ``add_security_flags``). Files are read at start; a file that cannot be used is
one error line naming the flag.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from holdfast.server.auth import AuthFileError, Authorizer
from holdfast.server.cli_support import seconds, whole_number
from holdfast.server.guard import ServerGuard, SessionLimits


class SecurityError(ValueError):
    """A TLS or token file that cannot be used (one line, naming the flag)."""


@dataclass(frozen=True, slots=True)
class ServerSecurity:
    """TLS, tokens and limits of one server; all off by default (local development)."""

    tls_cert: str | None = None
    """PEM certificate chain of the listener (``--tls-cert``)."""
    tls_key: str | None = None
    """PEM private key of the listener (``--tls-key``)."""
    tls_client_ca: str | None = None
    """PEM CA whose client certificates are required: mutual TLS (``--tls-client-ca``)."""
    auth_file: str | None = None
    """The tokens and their permissions (``--auth-file``, ``holdfast.server.auth``)."""
    limits: SessionLimits = field(default_factory=SessionLimits)

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise SecurityError("--tls-cert and --tls-key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise SecurityError("--tls-client-ca needs --tls-cert and --tls-key")

    @property
    def tls(self) -> bool:
        """Whether the listener speaks TLS."""
        return self.tls_cert is not None

    def credentials(self) -> grpc.ServerCredentials | None:
        """The listener's gRPC credentials (None: plaintext)."""
        if self.tls_cert is None or self.tls_key is None:
            return None
        chain = _read(self.tls_cert, "--tls-cert")
        key = _read(self.tls_key, "--tls-key")
        client_ca = _read(self.tls_client_ca, "--tls-client-ca") if self.tls_client_ca else None
        return grpc.ssl_server_credentials(
            [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
        )

    def guard(self) -> ServerGuard:
        """The guard of the server's sessions and calls (reads ``--auth-file``)."""
        authorizer = None
        if self.auth_file is not None:
            try:
                authorizer = Authorizer.load(self.auth_file)
            except AuthFileError as error:
                raise SecurityError(f"--auth-file: {error}") from None
        return ServerGuard(authorizer, self.limits)


def _read(path: str | None, flag: str) -> bytes:
    assert path is not None
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise SecurityError(f"{flag} {path}: {error.strerror}") from None
    if b"-----BEGIN" not in data:
        raise SecurityError(f"{flag} {path}: not a PEM file")
    return data


LIMIT_FLAGS = {
    "max_open_queues": "--max-open-queues",
    "new_queues_per_minute": "--new-queues-per-minute",
    "frames_per_second": "--frames-per-second",
    "confirm_errors_per_second": "--confirm-errors-per-second",
    "hello_timeout": "--hello-timeout",
}
"""Fields of ``SessionLimits`` and the flags that set them (for ``name_flags``)."""


def add_security_flags(parser: argparse.ArgumentParser) -> None:
    """TLS, token and limit flags of a server."""
    limits = SessionLimits()
    parser.add_argument("--tls-cert", metavar="PATH", help="PEM certificate: serve TLS")
    parser.add_argument("--tls-key", metavar="PATH", help="PEM private key of --tls-cert")
    parser.add_argument(
        "--tls-client-ca", metavar="PATH", help="require client certificates of this CA (mTLS)"
    )
    parser.add_argument(
        "--auth-file", metavar="PATH", help="JSON tokens and their domains (default: no auth)"
    )
    for name, text in (
        ("max-open-queues", "queue handles per session"),
        ("new-queues-per-minute", "new queues per token (per session without tokens)"),
        ("frames-per-second", "client frames per session; past it reading pauses"),
        ("confirm-errors-per-second", "refused CONFIRMs per session before it is ended"),
        ("proxy-max-open-queues", "queue handles per proxy session, its clients together"),
        ("proxy-new-queues-per-minute", "new queues per proxy token, its clients together"),
    ):
        default = getattr(limits, name.replace("-", "_"))
        parser.add_argument(
            f"--{name}",
            type=_at_least_one,
            default=default,
            metavar="N",
            help=f"{text} (default: {default})",
        )
    parser.add_argument(
        "--hello-timeout",
        type=_positive_seconds,
        default=limits.hello_timeout,
        metavar="SECONDS",
        help="end a session stream with no Hello by then (default: %(default)g)",
    )


_at_least_one = whole_number(1)
"""A limit flag's value (``--max-open-queues`` and the like)."""

MAX_HELLO_TIMEOUT = 3600.0
"""The longest ``--hello-timeout``: an hour is no deadline any more."""

_positive_seconds = seconds(MAX_HELLO_TIMEOUT)


def security_from_args(args: argparse.Namespace) -> ServerSecurity:
    """The ``ServerSecurity`` of parsed arguments (``SecurityError``/``ValueError``)."""
    return ServerSecurity(
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        auth_file=args.auth_file,
        limits=SessionLimits(
            max_open_queues=int(args.max_open_queues),
            new_queues_per_minute=int(args.new_queues_per_minute),
            frames_per_second=int(args.frames_per_second),
            confirm_errors_per_second=int(args.confirm_errors_per_second),
            proxy_max_open_queues=int(args.proxy_max_open_queues),
            proxy_new_queues_per_minute=int(args.proxy_new_queues_per_minute),
            hello_timeout=float(args.hello_timeout),
        ),
    )


__all__ = [
    "LIMIT_FLAGS",
    "SecurityError",
    "ServerSecurity",
    "add_security_flags",
    "security_from_args",
]
