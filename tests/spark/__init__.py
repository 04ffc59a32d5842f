"""Tests of the PySpark sink ``holdfast.sdk.spark``."""
