"""The Redis store: broker nodes that share their queues, active-active.

With ``--store redis://HOST:PORT[/DB]`` (``rediss://`` for TLS, or
``redis+cluster://HOST:PORT[,HOST:PORT...]``) a queue lives in Redis rather than in one
broker's memory, so any number of broker nodes on one Redis serve the same queues:
a consumer on node B gets what a producer posted on node A. The parts:

- ``keys``: the key layout (every key of a queue shares the hash tag ``{uri}``, so a
  queue is one cluster slot and every script touches one slot);
- ``scripts``: the Lua scripts that make each step atomic in Redis (dedup and enqueue,
  claim for delivery, confirm, requeue, reclaim a dead node's deliveries);
- ``client``: redis-py (with hiredis), the retry of Redis outages (up to
  ``--redis-retry`` seconds, then STORE_ERROR) and ``WAIT`` for replicas;
- ``queues``: the queues as the broker's sessions see them (the same calls as the
  in-memory ones); ``puts``: the PUT path;
- ``nodes``: node heartbeats, the reclaiming of dead nodes' deliveries, wake-ups
  (pub/sub plus polling) and the data-loss check.
"""
