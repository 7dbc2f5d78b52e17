"""A Spark session for the audit and replay jobs: `local[*]` by default, the cluster's when submitted."""

from __future__ import annotations

import os
import sys

from pyspark import SparkConf
from pyspark.sql import SparkSession

from retrytopics.connectors.spark_kafka import register

__all__ = ["get_session"]


def get_session(master: str | None = None, app_name: str = "retrytopics") -> SparkSession:
    """The active session, or a new one. `master=None` keeps what spark-submit set, else `local[*]`.

    Python workers must run an interpreter that has retrytopics and confluent-kafka: locally this one
    (PYSPARK_PYTHON defaults to sys.executable here); on a cluster, the packed venv (docs/spark.md)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).config("spark.ui.showConsoleProgress", "false")
    active = SparkSession.getActiveSession()
    if active is None and master is None and not SparkConf().contains("spark.master"):
        master = "local[*]"  # not under spark-submit
    if master is not None:
        builder = builder.master(master)
    session = active or builder.getOrCreate()
    register(session)
    return session
