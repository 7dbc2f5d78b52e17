"""The `retrytopics` command line. Argument parsing and printing only; every command delegates.

Settings come from `--config FILE` (TOML), the environment (`RETRYTOPICS_<SECTION>_<KEY>`,
`KAFKA_BOOTSTRAP_SERVERS`) and flags, in that order of precedence (see `retrytopics.config`). A bad value
exits with status 2 and a message that names the field.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from retrytopics.errors import ConfigError, RetryTopicsError

__all__ = ["build_parser", "main"]

Command = Callable[[argparse.Namespace], int]


def _settings(args: argparse.Namespace) -> Any:
    from retrytopics.config import load_settings

    flags = {
        "kafka": {"bootstrap": getattr(args, "bootstrap", None)},
        "app": {name: getattr(args, name, None) for name in ("topic", "group", "delays", "partitions", "naming", "dlq")},
        "metrics": {"port": getattr(args, "metrics_port", None)},
        "logging": {"level": getattr(args, "log_level", None), "json": getattr(args, "log_json", None) or None},
    }
    settings = load_settings(path=args.config, flags=flags)
    from retrytopics.logs import configure_logging

    configure_logging(settings.logging.level, json_lines=settings.logging.json)
    return settings


def _cmd_broker(args: argparse.Namespace) -> int:
    from retrytopics.connectors.embedded import EmbeddedBroker

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    with EmbeddedBroker(port=args.port) as broker:
        print(f"embedded Kafka broker (tansu) listening; bootstrap servers: {broker.bootstrap}", flush=True)
        print(f"log: {broker.log_path}; Ctrl-C to stop", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    return 0


def _cmd_topics_create(args: argparse.Namespace) -> int:
    from retrytopics.ops import provision_pipeline

    settings = _settings(args)
    outcome = provision_pipeline(settings.require_kafka(), settings.app)
    for topic, what in outcome.items():
        print(f"{what.value:8} {topic}")
    return 0


def _cmd_dlq_peek(args: argparse.Namespace) -> int:
    from retrytopics.ops import peek_dlq, pipeline_topics

    settings = _settings(args)
    dlq = args.dlq_topic or pipeline_topics(settings.app).dlq
    for record in peek_dlq(settings.require_kafka(), dlq, last=args.last, follow=args.follow):
        if args.json:
            print(json.dumps(record.as_dict(), sort_keys=True), flush=True)
        else:
            retry = record.retry or {}
            reason = retry.get("reason") or f"(bad headers: {record.header_error})"
            print(
                f"{record.topic}[{record.partition}]@{record.offset} {reason} "
                f"origin={retry.get('origin_message_id')} reconsume={retry.get('reconsume_times')} "
                f"{retry.get('exception_type')}: {retry.get('exception_message')} key={record.key}",
                flush=True,
            )
    return 0


def _common(parser: argparse.ArgumentParser, *, pipeline: bool = False) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML settings file")
    parser.add_argument("--bootstrap", metavar="HOST:PORT[,...]", help="Kafka bootstrap servers")
    parser.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--log-json", action="store_true", help="log one JSON object per line")
    if pipeline:
        parser.add_argument("--topic", help="source topic")
        parser.add_argument("--group", help="consumer group that owns the retries")
        parser.add_argument("--delays", type=lambda s: [d for d in s.split(",") if d], metavar="5s,30s,5m")
        parser.add_argument("--partitions", type=int, help="partitions of tier and DLQ topics (default: source's)")
        parser.add_argument("--naming", choices=["by_delay", "by_index", "shared"])
        parser.add_argument("--dlq", help="DLQ topic name (default from the naming strategy)")


def _add_topics(commands: Any) -> None:
    topics = commands.add_parser("topics", help="provision or describe the tier topics and DLQ of a pipeline")
    actions = topics.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create missing tier and DLQ topics (idempotent)")
    _common(create, pipeline=True)
    create.set_defaults(run=_cmd_topics_create)


def _add_dlq(commands: Any) -> None:
    dlq = commands.add_parser("dlq", help="look at dead-lettered records")
    actions = dlq.add_subparsers(dest="action", required=True, metavar="ACTION")
    peek = actions.add_parser("peek", help="the last records of the DLQ with decoded retry headers")
    _common(peek, pipeline=True)
    peek.add_argument("--dlq-topic", help="read this topic instead of the pipeline's DLQ")
    peek.add_argument("--last", type=int, default=20, help="records per partition (default 20)")
    peek.add_argument("--follow", action="store_true", help="keep printing new records")
    peek.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    peek.set_defaults(run=_cmd_dlq_peek)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="retrytopics", description="Non-blocking retries for Apache Kafka.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    broker = commands.add_parser("broker", help="run the embedded broker in the foreground for local development")
    broker.add_argument("--port", type=int, default=None, help="listen port (default: a free one)")
    broker.set_defaults(run=_cmd_broker)
    _add_topics(commands)
    _add_dlq(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except ConfigError as exc:
        print(f"retrytopics: configuration error: {exc}", file=sys.stderr)
        return 2
    except RetryTopicsError as exc:
        logging.getLogger("retrytopics").debug("command failed", exc_info=True)
        print(f"retrytopics: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
