"""Large replays from the console: a filter matching more records than the console replays itself runs as
the Spark replay job (`retrytopics.spark.replay.replay`: the same checks, replay id, ledger and guards) in a
thread of the console process, dry run first; the page follows its progress from Spark's status tracker.

One Spark job runs at a time (they share one Spark session); the console keeps the last few jobs' outcomes.
Needs the `spark` extra (and Java), as the console's actions do.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Final

from retrytopics.connectors.config import KafkaConfig
from retrytopics.console.filters import DlqFilter
from retrytopics.core.errors import ConfigError
from retrytopics.core.naming import TopicSet
from retrytopics.core.redaction import redact
from retrytopics.core.signing import HeaderKeys
from retrytopics.operator.progress import render_status

__all__ = ["SparkJobs", "SparkReplay", "spark_replay_id"]

_KEPT: Final = 8


def spark_replay_id(chosen: DlqFilter, destination: str) -> str:
    """The replay id of a filter's replay: the same filter and destination give the same id, so a second run
    writes nothing the first one wrote."""
    text = destination + ";" + "&".join(f"{k}={v}" for k, v in chosen.query())
    return "console-spark-" + hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(kw_only=True)
class SparkReplay:
    """One replay job: what it replays, and its state (starting, running, done, failed)."""

    job_id: str
    filter: DlqFilter
    destination: str
    replay_id: str
    dry_run: bool
    operator: str
    state: str = "starting"
    step: str = "starting Spark"
    result: dict[str, Any] | None = None
    error: str | None = None
    started_s: float = field(default_factory=time.monotonic)
    finished_s: float | None = None

    def progress(self) -> str:
        """The job's progress line, as `retrytopics replay` draws it on a terminal."""
        end = self.finished_s if self.finished_s is not None else time.monotonic()
        status = None
        if self.state == "running":  # imported only once the job's thread has imported Spark: two threads
            from retrytopics.spark.session import job_status  # importing pyspark at once can see it half-made

            status = job_status()
        return render_status(self.step, end - self.started_s, status)


class SparkJobs:
    """The console's Spark replays: at most one running, the last few kept for their pages."""

    def __init__(self, kafka: KafkaConfig, topics: TopicSet, header_keys: HeaderKeys | None) -> None:
        self._kafka = kafka
        self._topics = topics
        self._header_keys = header_keys
        self._lock = threading.Lock()
        self._jobs: dict[str, SparkReplay] = {}

    def get(self, job_id: str) -> SparkReplay | None:
        with self._lock:
            return self._jobs.get(job_id)

    def start(
        self, chosen: DlqFilter, *, destination: str, replay_id: str, dry_run: bool, operator: str
    ) -> SparkReplay:
        """Start a replay of every DLQ record `chosen` matches; refused while another one runs."""
        if chosen.key is not None or chosen.header is not None:
            raise ConfigError(
                "filter",
                chosen.query(),
                "the Spark replay selects by reason, exception type, "
                "time and origin id: run `retrytopics replay --where ...` for keys and headers",
            )
        with self._lock:
            if any(job.state in ("starting", "running") for job in self._jobs.values()):
                raise ConfigError("job", "running", "a Spark replay is running: wait for it to finish")
            job = SparkReplay(
                job_id=f"{replay_id}-{'dry' if dry_run else 'run'}-{int(time.time())}",
                filter=chosen,
                destination=destination,
                replay_id=replay_id,
                dry_run=dry_run,
                operator=operator,
            )
            self._jobs[job.job_id] = job
            for old in list(self._jobs)[:-_KEPT]:
                del self._jobs[old]
        threading.Thread(target=self._run, args=(job,), name=f"retrytopics-console-{job.job_id}", daemon=True).start()
        return job

    def _run(self, job: SparkReplay) -> None:
        try:
            from retrytopics.spark.replay import replay
            from retrytopics.spark.session import get_session, job_step

            spark = get_session(None, "retrytopics-console-replay")
            # Spark looks a Python data source up in the JVM thread's active session, which getOrCreate sets
            # only in the thread that created the session: without this, the replay's write from this thread
            # fails with DATA_SOURCE_NOT_FOUND once a session exists (the dry run's thread made it).
            jvm: Any = spark._jvm
            jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
            job.state, job.step = (
                "running",
                "replay: selecting DLQ records" + (" (dry run)" if job.dry_run else " and writing them"),
            )
            job_step(spark, job.step)
            chosen = job.filter
            job.result = replay(
                spark,
                self._kafka,
                self._topics,
                replay_id=job.replay_id,
                destination=job.destination,
                reasons=sorted(chosen.reasons) or None,
                exception_types=sorted(chosen.exception_types) or None,
                since_ms=chosen.since_ms,
                until_ms=chosen.until_ms,
                origin_ids=None if chosen.origin_id is None else [chosen.origin_id],
                dry_run=job.dry_run,
                header_keys=self._header_keys,
            )
            job.state, job.step = "done", "replay: done"
        except Exception as exc:  # noqa: BLE001 - the job's page shows why it failed; the console goes on
            job.state, job.step, job.error = "failed", "replay: failed", redact(f"{type(exc).__name__}: {exc}")
        finally:
            job.finished_s = time.monotonic()
