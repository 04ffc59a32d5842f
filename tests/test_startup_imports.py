"""What a server imports before it listens: every broker restart, every proxy start and
the admin command pay it, and a memory or sqlite broker has no use for redis-py (and
the OpenTelemetry SDK it loads) or for the SDK's front-ends. Each check runs in a fresh
interpreter, so no other test's imports count."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import holdfast.sdk
from holdfast.sdk.queue import Queue
from holdfast.sdk.rpc import Worker
from holdfast.sdk.session import Session

FRONT_ENDS = ("holdfast.sdk.session", "holdfast.sdk.queue", "holdfast.sdk.rpc")


def imported_by(statement: str, names: tuple[str, ...]) -> set[str]:
    """Which of ``names`` a fresh interpreter has imported after ``statement``."""
    probe = f"import sys\n{statement}\nprint(*[n for n in {names!r} if n in sys.modules])"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return set(done.stdout.split())


@pytest.mark.parametrize(
    "statement",
    [
        "import holdfast.broker.cli",
        "from holdfast.broker.stores import parse_store_spec as p; p('redis+sentinel://h:1/s')",
        "from holdfast.broker.config import BrokerConfig; BrokerConfig(store='sqlite:x.db')",
    ],
)
def test_checking_a_store_or_running_memory_or_sqlite_never_imports_redis_py(
    statement: str,
) -> None:
    assert imported_by(statement, ("redis",)) == set()


@pytest.mark.parametrize("module", ["holdfast.broker.cli", "holdfast.proxy.cli"])
def test_the_servers_leave_the_sdk_front_ends_unimported(module: str) -> None:
    assert imported_by(f"import {module}", FRONT_ENDS) == set()


def test_the_front_ends_are_imported_on_first_use_and_are_the_same_objects() -> None:
    assert imported_by("import holdfast.sdk", FRONT_ENDS) == set()
    assert imported_by("from holdfast.sdk import Session", FRONT_ENDS) >= {"holdfast.sdk.session"}
    assert holdfast.sdk.Session is Session
    assert holdfast.sdk.Queue is Queue
    assert holdfast.sdk.Worker is Worker
    assert {"Session", "Queue", "Worker", "HoldfastError"} <= set(dir(holdfast.sdk))
    lazy: dict[str, str] = vars(holdfast.sdk)["_LAZY"]
    for name, module in lazy.items():
        assert name in holdfast.sdk.__all__
        assert getattr(holdfast.sdk, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="no attribute 'Sesion'"):
        _ = holdfast.sdk.Sesion  # type: ignore[attr-defined]
