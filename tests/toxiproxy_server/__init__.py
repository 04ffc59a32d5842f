"""A Toxiproxy-compatible server for the fault-injection tests (stdlib only).

The Go ``toxiproxy-server`` cannot be installed on our test machines, so this
package implements the part of its HTTP API that the ``toxiproxy-python``
client drives, with the same semantics, and the TCP proxies behind it::

    python -m tests.toxiproxy_server --host 127.0.0.1 --port 8474

- ``api``: the HTTP/1.1 JSON API (proxies, toxics, ``/reset``, ``/version``,
  ``/populate``), with Toxiproxy's status codes and error bodies;
- ``proxies``: a proxy listens, dials its upstream for every client connection
  and moves bytes through two ``Link``s (``upstream``: client to server,
  ``downstream``: server to client), each a chain of toxics;
- ``toxics``: ``latency``, ``bandwidth``, ``timeout``, ``reset_peer``,
  ``limit_data`` and ``slow_close``, each what Toxiproxy's README documents.

Everything runs on one asyncio event loop, so no locks are needed.
"""
