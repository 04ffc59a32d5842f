"""Helpers shared by the test suites: broker processes, a wire-level client, recorders
and bounded waits."""
