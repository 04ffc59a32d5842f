"""The library's loggers: every logger of the package is ``holdfast`` or under it
(``holdfast.sdk.driver``, ``holdfast.broker.server``, ...), and ``holdfast`` carries a
``logging.NullHandler``, as the logging HOWTO asks of libraries. So an application that
configures no logging does not get the library's warnings on stderr through Python's
last-resort handler, and one that does configure logging gets every record through its
own handlers (records still propagate to the root logger).

Every package's ``__init__`` calls ``quiet_library_logger()``, so importing any module
of the library installs the handler.
"""

from __future__ import annotations

import logging

LIBRARY_LOGGER = "holdfast"
"""The name of the library's top-level logger."""


def quiet_library_logger() -> logging.Logger:
    """Give the ``holdfast`` logger a ``NullHandler`` (once); return the logger."""
    logger = logging.getLogger(LIBRARY_LOGGER)
    if not any(isinstance(handler, logging.NullHandler) for handler in logger.handlers):
        logger.addHandler(logging.NullHandler())
    return logger


__all__ = ["LIBRARY_LOGGER", "quiet_library_logger"]
