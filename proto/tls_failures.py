"""TLS failures in words: what gRPC's handshake errors mean, from either side.

gRPC reports a failed handshake as a line of OpenSSL jargon
(``Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL
routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: unable to get local issuer
certificate``), and a plaintext client talking to a TLS port sees only ``Socket
closed``. The SDK (``holdfast.sdk.transport``) and the servers' log routing
(``holdfast.server.grpc_logs``) name the failure with these tables, the raw text kept
after it. The same OpenSSL reason means different things on the two sides:
``WRONG_VERSION_NUMBER`` is "the server does not speak TLS" for a client and "a client
spoke plaintext" for a server.
"""

from __future__ import annotations

import socket
import ssl

CLIENT_FAILURES: tuple[tuple[str, str], ...] = (
    (
        "certificate has expired",
        "TLS: the server's certificate has expired (or is not valid yet)",
    ),
    (  # before CERTIFICATE_VERIFY_FAILED, which a not-yet-valid certificate's failure names too
        "certificate is not yet valid",
        "TLS: the server's certificate has expired (or is not valid yet)",
    ),
    (
        "CERTIFICATE_VERIFY_FAILED",
        "TLS: the server's certificate is not signed by a CA in tls_ca (unknown CA)",
    ),
    (
        "Peer name",
        "TLS: the server's certificate is not valid for the host name in the address",
    ),
    (
        "Hostname Verification Check failed",
        "TLS: the server's certificate is not valid for the host name in the address",
    ),
    (
        "WRONG_VERSION_NUMBER",
        "TLS: the server does not speak TLS on this port (drop tls_ca, or use its TLS port)",
    ),
    (
        "CERTIFICATE_REQUIRED",
        "TLS: the server requires a client certificate (set tls_cert and tls_key)",
    ),
    (
        "BAD_CERTIFICATE",
        "TLS: the server refused this client's certificate (not signed by its --tls-client-ca)",
    ),
    (
        "UNKNOWN_CA",
        "TLS: the server refused this client's certificate (not signed by its --tls-client-ca)",
    ),
)
"""(needle in gRPC's text, what it means for a client), first match wins."""

SERVER_FAILURES: tuple[tuple[str, str], ...] = (
    (
        "WRONG_VERSION_NUMBER",
        "TLS handshake failed: a client spoke plaintext to this TLS port "
        "(it needs tls_ca; --tls-ca for the admin CLI and the pool, --upstream-ca for a proxy)",
    ),
    (
        "HTTP_REQUEST",
        "TLS handshake failed: a client spoke plaintext to this TLS port "
        "(it needs tls_ca; --tls-ca for the admin CLI and the pool, --upstream-ca for a proxy)",
    ),
    (  # a client that rejects the server's certificate may stop before sending its own,
        # and the server sees only that: the two causes cannot be told apart from this side
        "PEER_DID_NOT_RETURN_A_CERTIFICATE",
        "TLS handshake failed: a client sent no certificate, and --tls-client-ca requires "
        "one (or it does not trust this server's certificate: its tls_ca is another CA)",
    ),
    (  # before CERTIFICATE_VERIFY_FAILED, which an expired certificate's failure names too
        "certificate has expired",
        "TLS handshake failed: a client's certificate has expired",
    ),
    (
        "certificate is not yet valid",
        "TLS handshake failed: a client's certificate is not valid yet",
    ),
    (
        "CERTIFICATE_VERIFY_FAILED",
        "TLS handshake failed: a client's certificate is not signed by --tls-client-ca",
    ),
    (
        "UNKNOWN_CA",
        "TLS handshake failed: a client does not trust this server's certificate "
        "(its tls_ca is another CA)",
    ),
    (
        "BAD_CERTIFICATE",
        "TLS handshake failed: a client rejected this server's certificate "
        "(another CA, expired, or not for the name it dialled)",
    ),
    (
        "CERTIFICATE_EXPIRED",
        "TLS handshake failed: a client found this server's certificate expired",
    ),
)
"""(needle in gRPC's log line, what it means for a server), first match wins."""

PLAINTEXT_TO_TLS = (
    "TLS: the server speaks TLS on this port and this session does not (set tls_ca: "
    "--tls-ca for the admin CLI and the pool, --upstream-ca for a proxy)"
)


def name_failure(text: str, table: tuple[tuple[str, str], ...] = CLIENT_FAILURES) -> str | None:
    """What ``text`` (a gRPC error or log line) means, if it is a TLS failure we know."""
    for needle, meaning in table:
        if needle in text:
            return meaning
    return None


def speaks_tls(address: str, timeout: float = 1.0) -> bool:
    """Whether the server at ``HOST:PORT`` answers a TLS ClientHello (no verification:
    a diagnosis of why a plaintext connection was closed, never a trust decision)."""
    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        with (
            socket.create_connection((host.strip("[]"), int(port)), timeout) as raw,
            context.wrap_socket(raw, server_hostname=host.strip("[]") or None) as tls,
        ):
            return tls.version() is not None
    except ssl.SSLError as error:  # a TLS alert is an answer in TLS; EOF is not
        return "ALERT" in str(error.reason or "")
    except (OSError, ValueError):
        return False


__all__ = [
    "CLIENT_FAILURES",
    "PLAINTEXT_TO_TLS",
    "SERVER_FAILURES",
    "name_failure",
    "speaks_tls",
]
