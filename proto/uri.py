"""Queue URIs: ``hf://<domain>/<queue>``. The rule lives in ``holdfast.proto.validate``
with the contract's other checks; this module keeps the older import path working."""

from holdfast.proto.validate import SCHEME, QueueUri, parse_queue_uri

__all__ = ["SCHEME", "QueueUri", "parse_queue_uri"]
