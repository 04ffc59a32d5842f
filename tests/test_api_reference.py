"""The API reference (docs/api/, rendered by mkdocstrings) documents every public name:
each name in the ``__all__`` of a public module, and each public method, property and
field of the classes among them. The site is built into a temporary folder and read
through its object inventory (``objects.inv``: every rendered object, and the names it
is re-exported under)."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import subprocess
import sys
import zlib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent

PUBLIC_MODULES = [
    "holdfast.sdk",
    "holdfast.sdk.aio",
    "holdfast.sdk.rpc",
    "holdfast.sdk.testing",
    "holdfast.sdk.spark",
    "holdfast.sdk.pool",
    "holdfast.sdk.admin",
    "holdfast.broker",
    "holdfast.proxy",
]
"""The modules users import (README, docs, examples); internal modules are not listed."""


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every object the built site documents, by dotted name: the page it is on."""
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    header, body = (site / "objects.inv").read_bytes().split(b"\n", 4)[3:]
    assert b"zlib" in header
    found: dict[str, str] = {}
    for line in zlib.decompress(body).decode().splitlines():
        name, _role, _priority, page = line.split(" ", 4)[:4]
        found[name] = page.split("#")[0]
    return found


def names_of(module: ModuleType, name: str) -> set[str]:
    """The dotted names an exported object may be documented under."""
    names = {f"{module.__name__}.{name}"}
    value = getattr(module, name)
    if inspect.isclass(value) or inspect.isfunction(value):
        names.add(f"{value.__module__}.{value.__qualname__}")
    return names


def members(cls: type) -> dict[str, object]:
    """The public members ``cls`` has from holdfast's own code (not from ``object``,
    ``Exception`` or ``Enum``), with fields that have no class attribute."""
    found: dict[str, object] = {}
    for base in reversed(cls.__mro__):
        if not base.__module__.startswith("holdfast."):
            continue
        for key in getattr(base, "__annotations__", {}):
            found[key] = None
        found.update(vars(base))
    if dataclasses.is_dataclass(cls):
        found.update({field.name: None for field in dataclasses.fields(cls)})
    if isinstance(cls, enum.EnumMeta):
        found.update({member.name: member for member in cls})  # type: ignore[var-annotated]
    return {key: value for key, value in found.items() if not key.startswith("_")}


def is_code(value: object) -> bool:
    return isinstance(value, property | staticmethod | classmethod) or inspect.isfunction(value)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_exported_name_is_in_the_api_reference(
    inventory: dict[str, str], module_name: str
) -> None:
    module = importlib.import_module(module_name)
    missing: list[str] = []
    undocumented: list[str] = []
    for name in module.__all__:
        documented = names_of(module, name) & inventory.keys()
        if not documented or not any(inventory[n].startswith("api/") for n in documented):
            missing.append(f"{module_name}.{name}")
            continue
        value = getattr(module, name)
        if not inspect.isclass(value):
            continue
        for key, member in members(value).items():
            if not {f"{n}.{key}" for n in documented} & inventory.keys():
                missing.append(f"{module_name}.{name}.{key}")
            elif is_code(member) and not inspect.getdoc(member):
                undocumented.append(f"{module_name}.{name}.{key}")
    assert not missing, "not in docs/api/:\n" + "\n".join(missing)
    assert not undocumented, "no docstring:\n" + "\n".join(undocumented)


def test_the_names_users_asked_for_are_there(inventory: dict[str, str]) -> None:
    for name in (
        "holdfast.sdk.session.Session.request",
        "holdfast.sdk.session.Session.request_async",
        "holdfast.sdk.session.Session.has_workers",
        "holdfast.sdk.Worker",
        "holdfast.sdk.spark.register",
        "holdfast.sdk.queue.Queue.uri",
    ):
        assert name in inventory, name
