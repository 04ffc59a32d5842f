"""The Spark writer's spans (issue #34): ``stage`` on the executor, ``commit`` and
``abort`` on the driver, with the messaging attributes, and failed when the step
raises."""

from __future__ import annotations

import pytest
from opentelemetry.trace import StatusCode

from holdfast.sdk.spark.spans import spark_span
from tests.otel.conftest import Telemetry


def test_a_stage_and_a_commit_make_spans_with_the_run_and_version(telemetry: Telemetry) -> None:
    with spark_span("stage", "hf://d/out", "job-1", 3):
        pass
    with pytest.raises(RuntimeError), spark_span("commit", "hf://d/out", "job-1", 3):
        raise RuntimeError("the broker refused")
    stage, commit = telemetry.named("stage "), telemetry.named("commit ")
    assert [s.name for s in stage + commit] == ["stage hf://d/out", "commit hf://d/out"]
    attributes = stage[0].attributes or {}
    assert attributes["messaging.system"] == "holdfast"
    assert attributes["messaging.destination.name"] == "hf://d/out"
    assert attributes["holdfast.spark.run_id"] == "job-1"
    assert attributes["holdfast.spark.version"] == 3
    assert stage[0].status.status_code is not StatusCode.ERROR
    assert commit[0].status.status_code is StatusCode.ERROR
