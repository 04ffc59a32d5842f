"""Tests of the mutation testing tools (mutation/)."""
