"""Library logging etiquette: every logger of the package is ``holdfast`` or under it,
and ``holdfast`` has a ``NullHandler`` whichever package is imported first, so an
application that configures no logging sees nothing of ours on stderr, and one that
configures logging gets every record."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_layout import PACKAGES, modules

ROOT = Path(__file__).resolve().parent.parent

# One leaf module per package too: importing it runs its package's __init__ first.
FIRST_IMPORTS = [
    *PACKAGES.values(),
    "holdfast.server.serve",
    "holdfast.sdk.backoff",
    "holdfast.pool.tracker",
    "holdfast.admin.render",
]

UNCONFIGURED = """
import importlib, logging, sys
importlib.import_module(sys.argv[1])
handlers = logging.getLogger("holdfast").handlers
assert [type(h).__name__ for h in handlers] == ["NullHandler"], handlers
for name in ("holdfast", "holdfast.sdk.driver", "holdfast.broker.server", "holdfast.pool"):
    logging.getLogger(name).warning("this must not reach stderr")
    logging.getLogger(name).error("nor this")
print("ok")
"""


@pytest.mark.parametrize("module", FIRST_IMPORTS)
def test_an_unconfigured_application_sees_nothing_of_ours_on_stderr(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", UNCONFIGURED, module],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"
    assert done.stderr == ""


def test_a_configured_application_gets_our_records() -> None:
    script = (
        "import logging, holdfast.sdk\n"
        "logging.basicConfig(format='%(name)s %(levelname)s %(message)s')\n"
        "logging.getLogger('holdfast.sdk.driver').warning('reached the root handler')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "holdfast.sdk.driver WARNING reached the root handler\n"


def test_importing_twice_installs_one_handler() -> None:
    import importlib
    import logging

    from holdfast.proto.logs import LIBRARY_LOGGER, quiet_library_logger

    for package in PACKAGES.values():
        importlib.import_module(package)
    quiet_library_logger()
    handlers = logging.getLogger(LIBRARY_LOGGER).handlers
    assert sum(isinstance(h, logging.NullHandler) for h in handlers) == 1


def test_every_logger_of_the_package_is_under_holdfast() -> None:
    """``getLogger(__name__)`` is (module names are ``holdfast.*``); a literal name must
    be too, or it would escape the NullHandler."""
    stray = []
    for name, path in modules().items():
        assert name.startswith("holdfast.")
        tree = ast.parse(path.read_text())
        # Reading the root logger's handlers (to see whether logging is configured) logs
        # nothing through it.
        reads = {
            id(node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr == "handlers"
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("getLogger")):
                continue
            if id(node) in reads:
                continue
            if not node.args:
                stray.append(f"{path.relative_to(ROOT)}:{node.lineno}: the root logger")
                continue
            arg = node.args[0]
            if isinstance(arg, ast.Name) and arg.id in ("__name__", "LIBRARY_LOGGER"):
                continue
            literal = arg.value if isinstance(arg, ast.Constant) else None
            if isinstance(literal, str) and f"{literal}.".startswith("holdfast."):
                continue
            stray.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(arg)}")
    assert not stray, "loggers outside 'holdfast':\n" + "\n".join(stray)
