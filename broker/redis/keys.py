"""The key layout of the Redis store.

Per queue (all with the hash tag ``{<uri>}``: one cluster slot per queue)::

    hf:{uri}:ready        list   GUIDs ready for delivery, head first
    hf:{uri}:body         hash   GUID -> payload
    hf:{uri}:meta         hash   GUID -> "<digest>|<accepted_ms>|<properties JSON>"
    hf:{uri}:count        hash   GUID -> delivery count
    hf:{uri}:out:<inc>    zset   GUIDs delivered by a node, not yet confirmed (score:
                                 time of delivery)
    hf:{uri}:took:<kind>:<inc>
                          list   a node's latest CLAIM, EXPIRE or SETTLE: its token, then
                                 GUID and reason per message it took (expires): a repeat
                                 of the take answers these (``takes``)
    hf:{uri}:g:<guid>     string the GUID's content digest, for the dedup window
                                 (expires after window + grace)
    hf:{uri}:consumers    hash   node -> consumers attached on that node
    hf:{uri}:handles      hash   node -> queue handles open on that node
    hf:{uri}:delayed      zset   GUIDs rejected with a delay (score: due time, ms)
    hf:{uri}:pickup       zset   GUIDs with a pickup TTL, never delivered yet (score:
                                 deadline, ms)
    hf:{uri}:bytes        string payload bytes of the queue's messages (depth limits)
    hf:{uri}:stats        hash   counters: accepted, redelivered, rejected, dead:<reason>
    hf:{uri}:leaving      hash   GUID -> "<since ms>|<reason>|<target>": moving out (to a
                                 dead-letter queue, or replayed), not gone yet
    hf:{uri}:seq          string the queue's write sequence: up one per PUT, claim and
                                 confirm script that changed it (``losses``); a
                                 delete leaves it to expire after two hours, and a
                                 script on the queue before then keeps it again
    hf:{uri}:unsynced     list   GUIDs stored but not yet on ``--redis-min-replicas``
                                 replicas: not delivered until they are (``durable``)
    hf:{uri}:synced       string a write that ``WAIT`` can vouch for (expires)
    hf:{uri}:mv:<id>      string a dead-letter or replay move already done (expires
                                 after window + grace): makes a repeated move a no-op

Global::

    hf:nodes              hash   incarnation -> when it joined (ms); the reaper's list
    hf:fence              string the fencing-token counter (only grows)
    hf:lease:{<inc>}      string an incarnation's lease: its token, with a TTL (``lease``)
    hf:mark:{<inc>}       string an incarnation's write mark, moved on by every renewal
    hf:node-mark:{<node id>}
                          string the same mark for the node process, across its
                                 incarnations: read back when it rejoins (expires)
    hf:node:<inc>:queues  set    queues an incarnation holds deliveries of
    hf:generation         string a random id set once: gone means Redis lost data

An incarnation is ``<node id>.<fencing token>``: a node that lost its lease rejoins
under a new one. The reaper removes a dead incarnation's lease, mark, queue set,
deliveries and counts (``reaper``).
    hf:wake               pub/sub channel: "a queue has new messages" (its URI)
    hf:queues             set    every queue URI a node opened, PUT to or gave a policy
    hf:policies           hash   queue URI or template -> policy JSON
    hf:changed            pub/sub channel: "policies changed" or "forget <uri>"

Messages, their counts and bytes, queue counters, the queue list and policies are
queue content (an operator's ``holdfast delete`` removes them) and never expire;
everything else does, or is removed by the reaper with its node. The write sequence
too is queue content, but a delete leaves it to expire (``losses.DELETED_SEQ_TTL``).
"""

from __future__ import annotations

NODES = "hf:nodes"
GENERATION = "hf:generation"
WAKE = "hf:wake"
QUEUES = "hf:queues"
POLICIES = "hf:policies"
CHANGED = "hf:changed"
POLICIES_CHANGED = "policies"
"""``hf:changed`` message: a node changed a policy (the others re-read them)."""
FORGET = "forget "
"""``hf:changed`` message prefix: the queue after it was deleted (the others drop it)."""


class QueueKeys:
    """The keys of one queue."""

    __slots__ = (
        "body",
        "bytes",
        "consumers",
        "count",
        "delayed",
        "handles",
        "leaving",
        "meta",
        "pickup",
        "prefix",
        "ready",
        "seq",
        "stats",
        "unsynced",
        "uri",
    )

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.prefix = "hf:{" + uri + "}:"
        self.ready = self.prefix + "ready"
        self.body = self.prefix + "body"
        self.meta = self.prefix + "meta"
        self.count = self.prefix + "count"
        self.consumers = self.prefix + "consumers"
        self.handles = self.prefix + "handles"
        self.delayed = self.prefix + "delayed"
        self.pickup = self.prefix + "pickup"
        self.bytes = self.prefix + "bytes"
        self.stats = self.prefix + "stats"
        self.leaving = self.prefix + "leaving"
        self.unsynced = self.prefix + "unsynced"
        self.seq = self.prefix + "seq"

    @property
    def message_keys(self) -> tuple[str, str, str, str]:
        """ready, body, meta, count: the keys most scripts start with."""
        return (self.ready, self.body, self.meta, self.count)

    @property
    def synced(self) -> str:
        """The key the durability check writes before ``WAIT`` (``durable``)."""
        return self.prefix + "synced"

    @property
    def moves(self) -> str:
        """The prefix of this queue's move markers."""
        return self.prefix + "mv:"

    def out(self, node: str) -> str:
        """The deliveries of ``node`` not yet confirmed."""
        return self.prefix + "out:" + node

    def took(self, node: str, kind: str) -> str:
        """What ``node``'s latest take of ``kind`` took, for a repeat of it (``takes``)."""
        return self.prefix + "took:" + kind + ":" + node


def lease_key(incarnation: str) -> str:
    """A node incarnation's lease (its fencing token, with a TTL: ``lease``)."""
    return "hf:lease:{" + incarnation + "}"


def mark_key(incarnation: str) -> str:
    """A node incarnation's write mark (same slot as its lease: ``lease``)."""
    return "hf:mark:{" + incarnation + "}"


def node_mark_key(node_id: str) -> str:
    """A node process's write mark across its incarnations (``lease``): the one Redis
    value a lapse does not reset, so a rejoin can tell whether Redis went back."""
    return "hf:node-mark:{" + node_id + "}"


def node_queues(node: str) -> str:
    """The queues a node holds deliveries of."""
    return "hf:node:" + node + ":queues"


__all__ = [
    "CHANGED",
    "FORGET",
    "GENERATION",
    "NODES",
    "POLICIES",
    "POLICIES_CHANGED",
    "QUEUES",
    "WAKE",
    "QueueKeys",
    "lease_key",
    "mark_key",
    "node_mark_key",
    "node_queues",
]
