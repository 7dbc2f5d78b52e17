"""PySpark data-source auto-discovery: PySpark imports top-level `pyspark_*` modules that define
`DefaultSource`, so an installed retrytopics makes `spark.read.format("retrytopics-kafka")` work without
`spark.dataSource.register(...)`."""

from retrytopics.connectors.spark_kafka import KafkaDataSource as DefaultSource

__all__ = ["DefaultSource"]
