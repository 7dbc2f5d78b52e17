"""`retrytopics console`: the operator console in the browser (needs the `console` extra).

    retrytopics console --bootstrap localhost:9092 --topic orders --group billing --delays 5s,1m
    retrytopics console --app billing.consumers:app --actions --token-file ~/.console-token

The pipeline at a glance (`/`), the DLQ searchable (`/dlq`), one origin id's whole story (`/lineage`), and a
replay of selected DLQ records (`/actions/replay`, only with `--actions` and a token). Reads Kafka directly,
no Spark needed to open a page. See docs/console.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from retrytopics.connectors.config import KafkaConfig
from retrytopics.core.errors import ConfigError
from retrytopics.operator.config import AppSettings

__all__ = ["app_renderer", "console_token", "keep_action_log", "serve"]


def console_token(path: str | None, environ: Mapping[str, str]) -> str | None:
    """The operators' token: from a file, else `RETRYTOPICS_CONSOLE_TOKEN`; never from the command line,
    where `ps` would show it."""
    if not path:
        return environ.get("RETRYTOPICS_CONSOLE_TOKEN") or None
    try:
        return Path(path).read_text(encoding="utf-8").strip() or None
    except OSError as exc:
        raise ConfigError("console.token_file", path, f"cannot read it: {exc.strerror or exc}") from None


def app_renderer(app: Any, topic: str) -> Callable[[Any], Any]:
    """Renders a DLQ entry's value through the value deserializer of `app`'s handler of `topic`."""
    from retrytopics.connectors.serde import deserialize

    binding = app.handlers[topic]

    def render(entry: Any) -> Any:
        return deserialize(
            binding.value_deserializer,
            entry.value,
            topic=topic,
            partition=entry.partition,
            offset=entry.offset,
            headers=list(entry.headers),
        )

    return render


def keep_action_log() -> None:
    """The action log (`retrytopics.console.actions`, INFO) passes whatever the log level (`retrytopics demo`
    logs at WARNING): it is the console's audit trail, not chatter."""
    logging.getLogger("retrytopics.console.actions").setLevel(logging.INFO)


def serve(
    kafka: KafkaConfig,
    pipeline: AppSettings,
    options: Any,
    *,
    port: int,
    grace_ms: int = 30_000,
    on_ready: Callable[[str], None] = print,
) -> None:
    """Serve the console until interrupted (Ctrl-C, SIGTERM)."""
    import uvicorn

    from retrytopics.console.reader import PipelineReader
    from retrytopics.console.web import create_app, is_loopback
    from retrytopics.operator.ops import pipeline_topics

    reader = PipelineReader(kafka=kafka, pipeline=pipeline, topics=pipeline_topics(pipeline), grace_ms=grace_ms)
    reader.bounds(reader.topics.dlq)  # a missing pipeline fails now, naming the topic, not on the first page
    reader.start_tally()
    keep_action_log()
    app = create_app(options, reader)
    config = uvicorn.Config(
        app, host=options.host, port=port, log_level="warning", access_log=False, server_header=False, log_config=None
    )
    server = uvicorn.Server(config)
    if not is_loopback(options.host):
        logging.getLogger("retrytopics.console").warning(
            "the console listens on %s: whoever reaches that address sees the DLQ's records", options.host
        )
    host = f"[{options.host}]" if ":" in options.host else options.host
    mode = "actions on" if options.actions else "read-only"
    on_ready(f"retrytopics console ({mode}) on http://{host}:{port}/  (Ctrl-C to stop)")
    logging.getLogger("retrytopics.console").info(
        "console serving %s on %s:%d", reader.topics.source, options.host, port
    )
    try:
        server.run()
    finally:
        reader.stop()
