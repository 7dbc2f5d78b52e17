# The image every retrytopics service in docker-compose.yml runs: the library and its CLI, Spark with a
# Java runtime (audit and replay jobs) and the example app.
# Bookworm, named: Spark 4.2 runs on Java 17, which Debian 12 packages (the unnamed slim tag follows
# Debian's newest release, whose Java packages differ).
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*

# Build and install the wheel from /src, then drop the sources: only the installed package is importable,
# so no source folder can shadow it.
# Spark's built-in Kafka connector (`--kafka-format builtin`) is fetched by spark-submit and must match this
# pyspark version exactly; it must also equal the pin of pyproject.toml's spark extra (pip refuses two pins)
# and docker-compose.yml passes the same SPARK_VERSION (tests/unit/test_compose.py checks all three).
ARG SPARK_VERSION=4.2.0
COPY . /src
RUN pip install --no-cache-dir "/src[spark,metrics]" "pyspark==${SPARK_VERSION}" \
    && mkdir -p /opt/retrytopics \
    && cp -r /src/examples /opt/retrytopics/examples \
    && rm -rf /src

ENV PYTHONPATH=/opt/retrytopics PYTHONUNBUFFERED=1 PYSPARK_PYTHON=python3
RUN useradd --system --uid 10001 --create-home retrytopics \
    && mkdir -p /var/lib/retrytopics/ivy /var/lib/retrytopics/reports \
    && chown -R retrytopics /var/lib/retrytopics
# Named volumes mounted here (Spark's package cache, audit reports) start with this owner.
VOLUME ["/var/lib/retrytopics/ivy", "/var/lib/retrytopics/reports"]
USER retrytopics
WORKDIR /home/retrytopics
