"""The Holdfast sidecar proxy: the broker's contract served locally, HA upstream.

Modules: ``server`` (the gRPC server and the proxy's lifecycle), ``client`` (one
connected application: its handles, routed onto the upstream), ``upstream`` (the
SDK's session engine driven by asyncio), ``config``, ``cli``.
"""

from holdfast.proto.logs import quiet_library_logger
from holdfast.proxy.config import ProxyConfig
from holdfast.proxy.server import Proxy

quiet_library_logger()

__all__ = ["Proxy", "ProxyConfig"]
