#!/usr/bin/env bash
# Set up a fresh machine for retrytopics: a virtual environment in .venv with the project installed in
# editable mode with its extras (edits take effect without reinstalling; tests/unit/test_packaging.py
# builds the real wheel and checks its contents), Java 17+ for Spark and Apache Kafka, and the Java jars the
# project runs but never commits (Apache Kafka's broker, Spark's Kafka connector), resolved by Maven into
# ~/.cache/retrytopics (or $RETRYTOPICS_CACHE), and Debian's chromium for the console's browser tests.
# Idempotent; without Maven it says so, and everything but Apache Kafka and Spark's built-in Kafka format
# still works (on the embedded tansu broker).
#   EXTRAS=test (default) | spark,embedded,metrics ...
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
    for candidate in python3.13 python3.12 python3.11; do
        if command -v "$candidate" >/dev/null; then python=$candidate; break; fi
    done
fi
"$python" -c 'import sys; assert sys.version_info >= (3, 11), f"Python >= 3.11 is required (pyspark 4 needs it), found {sys.version}"'

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $("$python" --version)"
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip 2>&1 | grep -v "is ignored" || true
echo "setup: installing retrytopics[${EXTRAS:-test}]"
# setuptools announces an editable install's meta path finder as a warning ("Editable installation. Please be
# careful with folders ..."): information for packagers, noise for a newcomer
PYTHONWARNINGS="ignore:Editable installation" \
    .venv/bin/python -m pip install --quiet --editable ".[${EXTRAS:-test}]" 2>&1 | grep -v -e "is ignored" -e "^\s*$" || true
# checked from outside the checkout too: the folder mapping must work from any directory
(cd / && "$OLDPWD/.venv/bin/python" -c 'import retrytopics.connectors.kafka, retrytopics.schemas')

java_major() {
    command -v java >/dev/null || { echo 0; return; }
    java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}
if [ "$(java_major)" -lt 17 ]; then
    echo "setup: Java 17+ not found (Spark needs it); installing openjdk-17-jre-headless"
    if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq openjdk-17-jre-headless >/dev/null
fi
if ! command -v chromium >/dev/null; then
    # the console's browser tests drive Debian's chromium through Playwright (never a downloaded browser)
    echo "setup: chromium not found; installing Debian's chromium (for the console's browser tests)"
    if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null; } \
        || echo "setup: could not install chromium: tests/integration/console will fail until it is installed"
fi
if ! command -v promtool >/dev/null; then
    # Debian's prometheus (and its promtool): the alert rules' unit tests and the scrape test (tests/integration/observe)
    echo "setup: promtool not found; installing Debian's prometheus (for the alert rules' tests)"
    if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } \
        || echo "setup: could not install prometheus: tests/integration/observe will fail until it is installed"
fi
if ! command -v mvn >/dev/null; then
    echo "setup: Maven not found; installing it (Apache Kafka's jars come through it)"
    if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq maven >/dev/null; } || true
fi
if command -v mvn >/dev/null; then
    # Apache Kafka's broker jars, and Spark's Kafka connector for the installed pyspark (cached after the first run)
    .venv/bin/python -m retrytopics.connectors.jars kafka spark | sed 's/^/setup: /'
else
    echo "setup: mvn not found: Apache Kafka and Spark's built-in Kafka format are unavailable; the embedded"
    echo "setup: tansu broker still works (RETRYTOPICS_TEST_BROKER=tansu, retrytopics demo --broker tansu)."
    echo "setup: install Maven 3.8+ (Debian: apt-get install maven) and rerun this script for Apache Kafka."
fi
echo "setup: java $(java_major), $(.venv/bin/python --version), ready"
