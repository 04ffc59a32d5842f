"""Holdfast's tests (a package, so that ``tests.support`` is importable from every test)."""
