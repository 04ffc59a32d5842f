"""The ``holdfast`` operator command: list, inspect, purge and delete queues, set their
policies and replay dead letters, through a broker's admin service
(``holdfast.sdk.admin``). ``cli`` parses and runs the commands; ``render`` prints
their results as tables or JSON."""

from holdfast.proto.logs import quiet_library_logger

quiet_library_logger()
