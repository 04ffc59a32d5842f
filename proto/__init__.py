"""The Holdfast wire contract (``holdfast.v1``): generated protobuf and gRPC code.

``holdfast.proto`` is the source; ``holdfast_pb2*.py`` are generated from it by
``python -m holdfast.proto.generate`` and checked in. ``PROTOCOL_VERSION`` is the
version a client announces in ``Hello`` and a broker accepts.
"""

from holdfast.proto import holdfast_pb2 as pb

PROTOCOL_VERSION = 1
"""The protocol version this code speaks."""

SERVICE_NAME = "holdfast.v1.Broker"
SESSION_METHOD = f"/{SERVICE_NAME}/Session"
"""The full gRPC method name of the session stream."""

__all__ = ["PROTOCOL_VERSION", "SERVICE_NAME", "SESSION_METHOD", "pb"]
