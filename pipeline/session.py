"""Building a quiet Spark session for the pipeline, with clear errors when Spark or Java is missing."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"

# Root level error, and the two loggers that otherwise print "Setting default log level" lines.
LOG4J2_PROPERTIES = """\
status = error
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
logger.submit.name = org.apache.spark.deploy.SparkSubmit
logger.submit.level = error
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
"""


class SparkUnavailable(Exception):
    """Spark cannot run here (pyspark not installed, no Java, or the JVM did not start)."""


def find_java() -> str | None:
    """Path of the java launcher Spark will use (JAVA_HOME first, as spark-submit does)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = os.path.join(home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("java")


def spark_problem() -> str | None:
    """Why Spark cannot run here, or None when pyspark and Java are present."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (install the project with its 'pipeline' extra)"
    if find_java() is None:
        return (
            "Java was not found: Spark needs a Java 17 runtime. Install one (e.g. the "
            "openjdk-17-jre-headless package) or set JAVA_HOME to its directory."
        )
    return None


def default_conf(master: str) -> dict[str, str]:
    """Settings measured to matter for small local runs (see the environment notes of the project)."""
    local = master.startswith("local")
    cores = os.cpu_count() or 2
    return {
        "spark.sql.shuffle.partitions": str(max(4, min(2 * cores, 16)) if local else 16),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.variant.allowDuplicateKeys": "true",
        "spark.sql.adaptive.enabled": "true",
        # Coalescing shuffle partitions put whole windows over millions of lines into a single task.
        "spark.sql.adaptive.coalescePartitions.enabled": "false",
        "spark.driver.memory": os.environ.get("RMQ_ANALYZE_DRIVER_MEMORY", "2g"),
        "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
        # Smaller file splits keep both cores busy on runs of a few large files.
        "spark.sql.files.maxPartitionBytes": "32m",
    }


class SparkHandle:
    """A Spark session plus what must be cleaned up when we created it."""

    def __init__(self, spark: SparkSession, owned: bool, conf_dir: str | None) -> None:
        self.spark = spark
        self.owned = owned
        self.conf_dir = conf_dir

    def stop(self) -> None:
        if self.owned:
            self.spark.stop()
        if self.conf_dir:
            shutil.rmtree(self.conf_dir, ignore_errors=True)


def start_spark(
    master: str | None = DEFAULT_MASTER,
    *,
    app_name: str = "rmq-analyze",
    conf: dict[str, str] | None = None,
) -> SparkHandle:
    """The active session when there is one (tests share one), else a new quiet session on `master`.

    `master` None: the master spark-submit was given when spark-submit started this driver (it sets
    PYSPARK_GATEWAY_PORT for the driver it launches), else local mode.
    """
    submitted = master is None and "PYSPARK_GATEWAY_PORT" in os.environ
    if master is None and not submitted:
        master = DEFAULT_MASTER
    problem = spark_problem()
    if problem:
        raise SparkUnavailable(problem)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return SparkHandle(active, owned=False, conf_dir=None)
    conf_dir = tempfile.mkdtemp(prefix="rmq-analyze-conf-")
    with open(os.path.join(conf_dir, "log4j2.properties"), "w", encoding="utf-8") as fh:
        fh.write(LOG4J2_PROPERTIES)
    # These are read by the JVM launcher and the Python workers, so they must be set before the session.
    os.environ["SPARK_CONF_DIR"] = conf_dir
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master is not None and master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings = default_conf(master or "")
    settings.update(conf or {})
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # the JVM failed to start: report it, never a traceback
        shutil.rmtree(conf_dir, ignore_errors=True)
        where = "the master spark-submit was given" if master is None else f"master {master!r}"
        raise SparkUnavailable(f"Spark did not start on {where}: {exc}") from exc
    spark.sparkContext.setLogLevel("ERROR")
    return SparkHandle(spark, owned=True, conf_dir=conf_dir)
