"""One Spark session for the whole folder (starting one costs 10-20 s here)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pipeline.session import spark_problem, start_spark


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    problem = spark_problem()
    if problem:
        pytest.skip(f"Spark is not available: {problem}")
    handle = start_spark("local[2]")
    yield handle.spark
    handle.spark.stop()
