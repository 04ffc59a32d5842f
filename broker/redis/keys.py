"""The key layout of the Redis store.

Per queue (all with the hash tag ``{<uri>}``: one cluster slot per queue)::

    hf:{uri}:ready        list   GUIDs ready for delivery, head first
    hf:{uri}:body         hash   GUID -> payload
    hf:{uri}:meta         hash   GUID -> "<digest>|<accepted_ms>|<properties JSON>"
    hf:{uri}:count        hash   GUID -> delivery count
    hf:{uri}:out:<node>   zset   GUIDs delivered by a node, not yet confirmed (score:
                                 time of delivery)
    hf:{uri}:g:<guid>     string the GUID's content digest, for the dedup window
                                 (expires after window + grace)
    hf:{uri}:consumers    hash   node -> consumers attached on that node

Global::

    hf:nodes              hash   node id -> last heartbeat (ms); the reaper's list
    hf:node:<id>          string a node's liveness (expires after 3 heartbeats)
    hf:node:<id>:queues   set    queues a node holds deliveries of
    hf:generation         string a random id set once: gone means Redis lost data
    hf:wake               pub/sub channel: "a queue has new messages" (its URI)

Messages are queue content and never expire; everything else does, or is removed by
the reaper with its node.
"""

from __future__ import annotations

NODES = "hf:nodes"
GENERATION = "hf:generation"
WAKE = "hf:wake"


class QueueKeys:
    """The keys of one queue."""

    __slots__ = ("body", "consumers", "count", "meta", "prefix", "ready", "uri")

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.prefix = "hf:{" + uri + "}:"
        self.ready = self.prefix + "ready"
        self.body = self.prefix + "body"
        self.meta = self.prefix + "meta"
        self.count = self.prefix + "count"
        self.consumers = self.prefix + "consumers"

    def out(self, node: str) -> str:
        """The deliveries of ``node`` not yet confirmed."""
        return self.prefix + "out:" + node


def node_key(node: str) -> str:
    """A node's liveness key."""
    return "hf:node:" + node


def node_queues(node: str) -> str:
    """The queues a node holds deliveries of."""
    return "hf:node:" + node + ":queues"


__all__ = ["GENERATION", "NODES", "WAKE", "QueueKeys", "node_key", "node_queues"]
