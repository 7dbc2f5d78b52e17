"""The demo's first run, as a new user sees it: start-up is reported on its own line (consumers join their
groups before the first order is produced, so the lateness figure is what a running pipeline gives), and the
demo ends by printing the console command to run next, which serves that very pipeline."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from retrytopics.connectors.broker_process import free_port
from retrytopics.connectors.config import KafkaConfig

pytestmark = pytest.mark.broker
CLI = str(Path(sys.executable).with_name("retrytopics"))


def test_the_demo_reports_start_up_apart_and_prints_a_console_command_that_works(kafka: KafkaConfig) -> None:
    demo = subprocess.run(
        [CLI, "demo", "--no-spark", "--records", "300", "--bootstrap", kafka.bootstrap],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    lines = demo.stdout.splitlines()
    assert any(line.split()[:1] == ["start-up"] for line in lines), demo.stdout
    assert any(line.split()[:2] == ["run", "time"] for line in lines), demo.stdout
    dead = sum(int(line.split()[-1]) for line in lines if line.strip().startswith("dead-lettered:"))
    command = lines[-1].partition("Next, see this run in the browser: ")[2]
    assert command.startswith("retrytopics console "), demo.stdout
    port = free_port()
    args = [*shlex.split(command)[1:], "--port", str(port)]
    console = subprocess.Popen([CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/pipeline", timeout=5) as response:
                    data = json.load(response)
                counted = data["counted"]
                if counted["records"] == counted["of"] and counted["of"]:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline and console.poll() is None, (
                console.stderr.read() if console.stderr else ""
            )
            time.sleep(0.2)
        stages = {s["kind"]: s for s in data["stages"]}
        assert stages["source"]["records"] == 300 and stages["dlq"]["records"] == dead
        assert sum(n for _, n in data["dlq_by_reason"]) == dead
    finally:
        console.terminate()
        console.wait(10)
