"""The ``holdfast`` operator command: list, inspect, purge and delete queues, set their
policies and replay dead letters, through a broker's admin service
(``holdfast.sdk.admin``), and make development certificates (``certs``). ``options``
is the command line (connection options before or after the command, the
environment), ``cli`` runs a command and maps failures to exit codes, ``commands``
holds the admin commands and ``render`` prints their results as tables or JSON."""

from holdfast.proto.logs import quiet_library_logger

quiet_library_logger()
