"""The Redis store: broker nodes that share their queues, active-active.

With ``--store redis://HOST:PORT[/DB]`` (``rediss://`` for TLS,
``redis+cluster://HOST:PORT[,HOST:PORT...]``, or
``redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]``) a queue lives in Redis
rather than in one broker's memory, so any number of broker nodes on one Redis serve
the same queues: a consumer on node B gets what a producer posted on node A. The parts:

- ``keys``: the key layout (every key of a queue shares the hash tag ``{uri}``, so a
  queue is one cluster slot and every script touches one slot);
- ``put_scripts``, ``scripts``, ``policy_scripts``, ``move_scripts``,
  ``admin_scripts``, ``staging_scripts`` and ``staging_side_scripts``: the Lua scripts
  that make each step atomic in Redis (dedup, depth limit and enqueue; claim with the
  delivery limit and TTLs; confirm, requeue, reclaim; delays, expiry, dead-letter
  moves, the admin's reads; transactional writes), each with the one function that
  lays out its KEYS and ARGV (``script``);
- ``spec``: a ``--store redis...`` value parsed (without importing redis-py, which a
  memory or sqlite broker never loads); ``client``: redis-py (with hiredis), TLS and
  Sentinel, the retry of Redis outages (up to ``--redis-retry`` seconds, then
  STORE_ERROR, unless a PUT reached Redis unanswered: ``puts``) and ``WAIT`` for
  replicas;
- ``registry`` and ``queues``: the queues as the broker's sessions see them (the same
  calls as the in-memory ones: ``holdfast.broker.interfaces``); ``puts``: the PUT path;
- ``policies``: every node's copy of the queue policies kept in Redis;
- ``graveyard``: dead-letter moves and replays; ``sweep``: the timed rules;
- ``admin``: the ``holdfast.v1.Admin`` service's work on Redis;
- ``lease`` (with ``lease_scripts``): a node's fenced lease, renewed on a thread of
  its own; ``reaper``: reclaiming the deliveries of incarnations whose lease expired;
  ``losses`` and ``losscheck``: write sequences read back, LOST DATA reports;
  ``durable``: delivery only once ``--redis-min-replicas`` replicas have a message;
  ``refresh``: the open queues' counts; ``metrics``: the node's Prometheus figures;
- ``nodes``: the node's life (lease events, the loops, wake-ups by pub/sub plus
  polling); ``backend`` starts everything together.
"""
