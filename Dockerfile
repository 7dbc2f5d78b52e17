# The image every retrytopics service in docker-compose.yml runs: the library and its CLI, Spark with a
# Java runtime (audit and replay jobs) and the example app.
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*

# Build and install the wheel from /src, then drop the sources: only the installed package is importable,
# so no source folder can shadow it.
# Spark's built-in Kafka connector (`--kafka-format builtin`) is fetched by spark-submit and must match this
# pyspark version exactly; docker-compose.yml passes the same SPARK_VERSION to both.
ARG SPARK_VERSION=4.3.0
COPY . /src
RUN pip install --no-cache-dir "/src[spark,metrics]" "pyspark==${SPARK_VERSION}" \
    && mkdir -p /opt/retrytopics \
    && cp -r /src/examples /opt/retrytopics/examples \
    && rm -rf /src

ENV PYTHONPATH=/opt/retrytopics PYTHONUNBUFFERED=1 PYSPARK_PYTHON=python3
RUN useradd --system --uid 10001 --create-home retrytopics
USER retrytopics
WORKDIR /home/retrytopics
