"""The distribution ``holdfast-mq`` as a user gets it: the sdist and the wheel built
from a copy of the source tree (``python -m build`` builds the wheel from the sdist,
so a file missing from the sdist is missing from the wheel too), the wheel installed
(not editable) in a fresh venv from the package index pip is configured with, and
``mypy --strict`` run on ``examples/`` against that install only."""

from __future__ import annotations

import email.parser
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIST_NAME = "holdfast-mq"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SCRIPTS = set(PYPROJECT["project"]["scripts"])

pytestmark = pytest.mark.slow


def source_packages() -> dict[str, Path]:
    """Every package of the source tree by import name (``holdfast.sdk.aio``), through
    pyproject's ``package-dir`` mapping."""
    found: dict[str, Path] = {}
    for package, folder in PYPROJECT["tool"]["setuptools"]["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found[".".join((package, *parts))] = init.parent
    return found


def run(*command: str | Path, cwd: Path | None = None, timeout: float = 90) -> str:
    """Run ``command``; fail with its output unless it exits 0; return its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder holding the sdist and the wheel, built from a copy of the files git
    tracks (or would: untracked, not ignored), so the build never writes in the tree."""
    base = tmp_path_factory.mktemp("dist")
    listed = run("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT)
    source = base / "source"
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # a tracked file deleted in the work tree is skipped
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    out = base / "out"
    run(sys.executable, "-m", "build", "--outdir", out, source, timeout=150)
    return out


def only(folder: Path, pattern: str) -> Path:
    (found,) = folder.glob(pattern)
    return found


@pytest.mark.timeout(170)
def test_the_wheel_holds_every_package_each_with_its_typed_marker(dist: Path) -> None:
    wheel = only(dist, "holdfast_mq-*-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(metadata_name).decode())
        entry_points = archive.read(metadata_name.replace("METADATA", "entry_points.txt"))
    assert metadata["Name"] == DIST_NAME
    assert metadata["License-Expression"] == "Apache-2.0"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "no LICENSE"
    assert "spark" in metadata.get_all("Provides-Extra", [])
    packages = source_packages()
    for package, folder in packages.items():
        path = package.replace(".", "/")
        assert f"{path}/__init__.py" in names, f"{package} is not in the wheel"
        assert f"{path}/py.typed" in names, f"{package} has no py.typed in the wheel"
        for module in folder.glob("*.py"):
            assert f"{path}/{module.name}" in names, f"{path}/{module.name} is not in the wheel"
    assert {"holdfast/proto/holdfast.proto", "holdfast/proto/holdfast_pb2.pyi"} <= names
    # No stray top-level package (``sdk``, ``broker``): everything lives under holdfast/.
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"holdfast"}
    for script in SCRIPTS:
        assert f"{script} = holdfast." in entry_points.decode()


@pytest.mark.timeout(60)
def test_the_sdist_is_named_for_the_distribution(dist: Path) -> None:
    sdist = only(dist, "holdfast_mq-*.tar.gz")
    listing = run("tar", "tzf", sdist).splitlines()
    top = listing[0].split("/")[0]
    for name in ("pyproject.toml", "README.md", "LICENSE", "sdk/py.typed", "proto/holdfast.proto"):
        assert f"{top}/{name}" in listing, f"{name} is not in {sdist.name}"


def fresh_venv(path: Path, *install: str | Path) -> Path:
    """A new venv at ``path`` with ``pip install INSTALL`` (dependencies from the
    package index pip is configured with); its python."""
    run(sys.executable, "-m", "venv", path)
    python = path / "bin" / "python"
    run(python, "-m", "pip", "install", "--quiet", *install, timeout=150)
    return python


def mypy_strict_passes_on_the_examples(python: Path, tmp_path: Path) -> None:
    """``mypy --strict`` on a copy of ``examples/`` finds holdfast in ``python``'s
    environment, typed: the examples pass, and a probe with one error fails on it (an
    untyped package would make ``Session`` Any, and no error)."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "examples", project / "examples")
    (project / "probe.py").write_text(
        "from holdfast.sdk import Session\n\nport: int = Session.open_queue\n"
    )
    (project / "mypy.ini").write_text(
        "[mypy]\nstrict = True\n\n[mypy-pyspark.*]\nignore_missing_imports = True\n"
    )
    # mypy from the test venv, looking only at the other environment's packages.
    mypy: list[str | Path] = [sys.executable, "-m", "mypy", "--python-executable", python]
    mypy += ["--cache-dir", tmp_path / "cache", "--strict"]
    checked = run(*mypy, "examples", cwd=project, timeout=150)
    assert checked.startswith("Success: no issues found"), checked
    probe = subprocess.run(
        [str(part) for part in (*mypy, "probe.py")],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert probe.returncode == 1, probe.stdout + probe.stderr
    assert "probe.py:3: error: Incompatible types in assignment" in probe.stdout, probe.stdout
    assert '-> Queue", variable has type "int")' in probe.stdout, probe.stdout


@pytest.mark.timeout(170)
def test_mypy_strict_on_the_examples_against_a_non_editable_install(
    dist: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    python = fresh_venv(venv, only(dist, "holdfast_mq-*-py3-none-any.whl"))
    # The install is a real one: files in site-packages, the metadata under the new name.
    where = run(python, "-c", "import holdfast.sdk; print(holdfast.sdk.__file__)")
    assert str(venv) in where and "site-packages" in where
    assert run(venv / "bin" / "holdfast", "--version").startswith("holdfast 0.1.0")
    mypy_strict_passes_on_the_examples(python, tmp_path)


@pytest.mark.timeout(170)
def test_mypy_strict_against_an_editable_install_in_strict_mode(dist: Path, tmp_path: Path) -> None:
    """What the README tells contributors: ``pip install -e . --config-settings
    editable_mode=strict`` gives type checkers a tree they can follow."""
    source = dist.parent / "source"
    python = fresh_venv(
        tmp_path / "venv", "-e", source, "--config-settings", "editable_mode=strict"
    )
    where = run(python, "-c", "import holdfast.sdk; print(holdfast.sdk.__file__)")
    assert "site-packages" not in where and str(source) in where
    mypy_strict_passes_on_the_examples(python, tmp_path)
