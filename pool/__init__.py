"""``holdfast-pool``: keyed worker pools that start and stop on demand (osrdyne).

Every request names a key (``session.request(pool_uri, payload, key=k)``); the
requests of a key go to the key's own queue and are served by a worker group
specialised for it, started when the first request for the key arrives and stopped
when the key goes idle. The pieces, each with one job:

- ``tracker``: the expected state of each key (active, unbound, stopped) with a
  generation number per change, and what the control loops have converged on;
- ``control``: two loops converging the actual state on it: one for the key queues
  (their policies: bound, or redirected to the orphans), one for the worker groups;
- ``orphans``: the orphan processor: requests the broker redirected because their
  key had no bound queue; it asks the tracker for the key, waits until the key's
  queue is bound, forwards the request there under its GUID (a repeat is harmless:
  dedup), then confirms the orphan;
- ``activity``: workers' ``started`` / ``request-received`` reports, debounced;
- ``drivers``: how worker groups run (``subprocess``, ``noop``; the interface for
  docker or Kubernetes);
- ``leader``: one active manager per pool (a token message only one holds);
- ``manager`` assembles them; ``cli`` is the command.
"""

from holdfast.proto.logs import quiet_library_logger

quiet_library_logger()
