"""One Spark session for the whole folder (starting one costs 10-20 s here); Spark tests skip with the
reason when pyspark or Java is missing, the reference tests still run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pipeline.session import spark_problem, start_spark


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    problem = spark_problem()
    if problem:
        pytest.skip(f"Spark tests need pyspark and Java: {problem}")
    handle = start_spark("local[2]")
    yield handle.spark
    handle.stop()
