"""The server shell the broker and the proxy share: everything between a gRPC listener
and the code that decides what a frame means.

- ``stream`` and ``outbox``: one served session stream (Hello, framing, the writer);
- ``guard`` and ``auth``: what a server enforces per client (its token, its limits);
- ``security``: TLS on the listener, the token file, the per-client limits as settings;
- ``serve``: binding a gRPC server of the contract, signals, ``HOST:PORT``;
- ``metrics_http``: the Prometheus endpoint with ``/healthz`` and ``/readyz``;
- ``cli_support``: the flags, environment variables and log formats both command lines share.

The wire itself (generated code, validation, limits, policy values) is ``holdfast.proto``.
"""

from holdfast.proto.logs import quiet_library_logger

quiet_library_logger()
