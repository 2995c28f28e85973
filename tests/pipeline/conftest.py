"""One Spark session for the whole folder (starting one costs 10-20 s here); Spark tests skip with the
reason when pyspark or Java is missing, the reference tests still run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kit.spark_cluster import ClusterFailed, standalone_cluster

from rmqlab.pipeline.session import spark_problem, start_spark


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    problem = spark_problem()
    if problem:
        pytest.skip(f"Spark tests need pyspark and Java: {problem}")
    handle = start_spark("local[2]")
    yield handle.spark
    handle.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """spark://127.0.0.1:PORT of a standalone master with one worker (2 cores, 1 GiB), shared by the
    folder's tests (starting one costs two JVM starts)."""
    problem = spark_problem()
    if problem:
        pytest.skip(f"Spark tests need pyspark and Java: {problem}")
    try:
        with standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as url:
            yield url
    except ClusterFailed as e:
        pytest.fail(str(e))
