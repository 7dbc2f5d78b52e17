"""The `retrytopics` command line. Argument parsing and printing only; every command delegates (checks that
run before any work live in `retrytopics.operator.preflight`). Over the 300-line budget because the parser of every
command is here, in one place to read `--help` from.

Settings come from the app's own code (`run`, `tiers`), `--config FILE` or `RETRYTOPICS_CONFIG` (TOML), the
environment (`RETRYTOPICS_<SECTION>_<KEY>`, `KAFKA_BOOTSTRAP_SERVERS`) and flags, each overriding the one
before (see `retrytopics.operator.config`). A bad value exits with status 2 and a message that names the field. A
command whose reader goes away (`... | head -1`) stops quietly with status 141, as if killed by SIGPIPE.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from retrytopics.core.errors import ConfigError, RetryTopicsError
from retrytopics.operator import preflight

__all__ = ["build_parser", "main"]

Command = Callable[[argparse.Namespace], int]


def _settings(args: argparse.Namespace) -> Any:
    from retrytopics.operator.config import load_settings

    flags = {
        "kafka": {"bootstrap": getattr(args, "bootstrap", None)},
        "app": {
            name: getattr(args, name, None)
            for name in (
                "topic",
                "group",
                "delays",
                "partitions",
                "replication_factor",
                "min_insync_replicas",
                "naming",
                "dlq",
                "header_key_file",
                "concurrency",
            )
        },
        "metrics": {"port": getattr(args, "metrics_port", None)},
        "logging": {"level": getattr(args, "log_level", None), "json": getattr(args, "log_json", None) or None},
    }
    settings = load_settings(path=args.config, flags=flags)
    from retrytopics.operator.logs import configure_logging

    configure_logging(settings.logging.level, json_lines=settings.logging.json)
    return settings


def _duration_ms(text: str) -> int:
    from retrytopics.core.durations import parse_duration

    try:
        return parse_duration(text, field="duration")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.reason) from None


def _cmd_broker(args: argparse.Namespace) -> int:
    from retrytopics.connectors.brokers import local_broker

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    with local_broker(args.kind, port=args.port) as broker:
        print(f"{broker.description} listening; bootstrap servers: {broker.bootstrap}", flush=True)
        print(f"log: {broker.log_path}; Ctrl-C to stop", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    return 0


def _cmd_topics_create(args: argparse.Namespace) -> int:
    from retrytopics.operator.ops import provision_pipeline

    kafka, pipeline = preflight.pipeline_of(getattr(args, "app", None), _settings(args))
    outcome = provision_pipeline(kafka, pipeline, create_source=args.create_source, broker_dlq=args.broker_dlq)
    for topic, what in outcome.items():
        print(f"{what.value:8} {topic}")
    print(_WRITE_ADVICE + ("" if pipeline.header_keys is not None else _NO_KEY_ADVICE), file=sys.stderr)
    return 0


#: Printed by `topics create` (stderr: stdout lists the topics). Why: docs/operations.md, ACLs.
_WRITE_ADVICE = (
    "retrytopics: note: grant WRITE on the tier topics and the DLQ to this app's principals only. WRITE there is "
    "WRITE on the app's fate: a record written there can make its consumers skip a source record they have not "
    "committed yet, or retry one with forged state (docs/operations.md, ACLs)."
)
_NO_KEY_ADVICE = (
    " No header_key is set, so nothing read back from those topics is verified: set [app] header_key_file "
    "(RetryApp(header_key=...)) if any other principal can write them."
)


def _cmd_dlq_peek(args: argparse.Namespace) -> int:
    from retrytopics.operator.ops import peek_dlq, pipeline_topics

    kafka, pipeline = preflight.pipeline_of(getattr(args, "app", None), _settings(args))
    dlq = args.dlq_topic or pipeline_topics(pipeline).dlq
    records = peek_dlq(kafka, dlq, last=args.last, follow=args.follow)
    if args.json:
        for record in records:
            print(json.dumps(record.as_dict(), sort_keys=True), flush=True)
    elif args.follow:  # a live tail: each row as it comes, in fixed widths (a longer cell pushes the rest)
        from retrytopics.operator.reports import cell

        def line(cells: Sequence[str]) -> str:
            return "  ".join(c.ljust(w) for c, w in zip(cells, _PEEK_WIDTHS, strict=True)).rstrip()

        print(line(_PEEK_COLUMNS), flush=True)
        for record in records:
            print(line([cell(c) for c in _peek_row(record)]), flush=True)
    else:
        from retrytopics.operator.reports import table

        rows = [_peek_row(record) for record in records]
        print(table(_PEEK_COLUMNS, rows) if rows else f"no records in {dlq}")
    return 0


_PEEK_COLUMNS = ("record", "reason", "failures", "origin id", "exception", "key")
_PEEK_WIDTHS = (32, 21, 8, 24, 60, 0)
#: The longest a peek cell that comes from the record (id, exception text, key) is printed.
_PEEK_ID_LIMIT, _PEEK_EXCEPTION_LIMIT, _PEEK_KEY_LIMIT = 40, 60, 40


def _peek_row(record: Any) -> list[Any]:
    """One DLQ record as a row of `_PEEK_COLUMNS`; undecodable retry headers show their problem instead.
    Text from the record is untrusted: escaped and shortened (`reports.safe_text`)."""
    from retrytopics.operator.reports import safe_text

    def shown(text: object, limit: int) -> str | None:
        return None if text is None else safe_text(str(text), limit)

    where = f"{record.topic}[{record.partition}]@{record.offset}"
    key = shown(record.key, _PEEK_KEY_LIMIT)
    retry = record.retry
    if retry is None:
        return [where, "bad headers", None, None, shown(record.header_error, _PEEK_EXCEPTION_LIMIT), key]
    exception = ": ".join(str(part) for part in (retry.get("exception_type"), retry.get("exception_message")) if part)
    return [
        where,
        shown(retry.get("reason"), _PEEK_EXCEPTION_LIMIT),
        retry.get("reconsume_times"),
        shown(retry.get("origin_message_id"), _PEEK_ID_LIMIT),
        shown(exception or None, _PEEK_EXCEPTION_LIMIT),
        key,
    ]


def _cmd_topics_describe(args: argparse.Namespace) -> int:
    from retrytopics.operator.guard import describe_flood_guard, flood_guard_text
    from retrytopics.operator.ops import (
        SHARE_STATE_UNAVAILABLE,
        describe_key_state,
        describe_pipeline,
        describe_share_group,
    )
    from retrytopics.operator.reports import safe_text, table

    kafka, pipeline = preflight.pipeline_of(getattr(args, "app", None), _settings(args))
    rows = describe_pipeline(kafka, pipeline, grace_ms=args.grace)
    share = describe_share_group(kafka, pipeline)
    key_state = describe_key_state(kafka, pipeline)
    flood_guard = describe_flood_guard(kafka, pipeline)
    blocked: dict[int, int] = {}
    if key_state is not None:  # a source partition's state: its blocked keys
        blocked = key_state.blocked_keys(sum(1 for r in rows if r.kind == "source"))
        rows = [replace(r, state=_blocked(blocked.get(r.partition, 0))) if r.kind == "source" else r for r in rows]
    if args.json:
        out: Any = [row.as_dict() for row in rows]
        if pipeline.consumer == "share" or key_state is not None or flood_guard is not None:
            out = {"partitions": out}
        if pipeline.consumer == "share":
            out["share_group"] = {"configs": share, "state": SHARE_STATE_UNAVAILABLE}
        if key_state is not None:
            out["key_state"] = {**key_state.as_dict(), "blocked_keys": blocked}
        if flood_guard is not None:
            out["flood_guard"] = flood_guard.as_dict(int(time.time() * 1000))
        print(json.dumps(out))
        return 0
    columns = ["topic", "kind", "partition", "end", "committed", "lag", "state", "replicas", "isr", "min_isr"]
    print(
        table(
            columns,
            [
                [
                    r.topic,
                    r.kind,
                    r.partition,
                    r.end_offset,
                    r.committed,
                    r.lag,
                    r.state,
                    r.replicas,
                    r.in_sync_replicas,
                    r.min_insync_replicas,
                ]
                for r in rows
            ],
            align="llrrrrlrrr",
        )
    )
    if pipeline.consumer == "share":
        print(f"\nshare group {safe_text(pipeline.group or '')}:")
        for name, value in sorted(share.items()):
            print(f"  {safe_text(name)} = {safe_text(value)}")
        print(f"  {SHARE_STATE_UNAVAILABLE}")
    if key_state is not None:
        from retrytopics.operator.reports import key_state_text

        print(f"\n{key_state_text(key_state.as_dict())}")
    if flood_guard is not None:
        print(f"\n{flood_guard_text(flood_guard.as_dict(int(time.time() * 1000)))}")
    return 0


def _cmd_guard(args: argparse.Namespace) -> int:
    from retrytopics.core.flood_records import GuardAction
    from retrytopics.operator.guard import operator_name, send_guard_command

    if args.handler is not None:
        if args.topic not in (None, args.handler):
            raise ConfigError("handler", args.handler, f"and --topic {args.topic!r} name two handlers")
        args.topic = args.handler
    kafka, pipeline = preflight.pipeline_of(getattr(args, "app", None), _settings(args))
    command = send_guard_command(kafka, pipeline, GuardAction(args.action), reason=args.reason, by=operator_name())
    # every process of the app applies it and logs it with the reason; `topics describe` shows their reports
    print(f"{command.action} sent to the flood guard of {command.handler} by {command.by}: {command.reason}")
    return 0


def _blocked(keys: int) -> str:
    return f"{keys} blocked key{'' if keys == 1 else 's'}"


def _serve_metrics(app: Any, port: int | None) -> None:
    if port is None:
        return
    from retrytopics.observe.metrics import PrometheusHook

    hook = PrometheusHook(failures_by_exception=True)  # the dashboard's failures by exception type
    hook.track_health(lambda: bool(app.healthy))
    for key, value in hook.consumer_properties().items():
        app.consumer_overrides.setdefault(key, value)  # the app's own stats_cb, if any, wins
    try:
        hook.serve(port)
    except OSError as exc:  # e.g. the port is taken: a start-up error like any other bad setting
        raise ConfigError("metrics.port", port, f"cannot serve metrics: {exc.strerror or exc}") from None
    app.add_hook(hook)
    logging.getLogger("retrytopics").info("metrics on http://0.0.0.0:%d/metrics", port)


def _prepared_app(args: argparse.Namespace) -> tuple[Any, Any]:
    settings = _settings(args)
    return settings, preflight.prepare_app(args.app, settings)


def _cmd_run(args: argparse.Namespace) -> int:
    settings, app = _prepared_app(args)
    _serve_metrics(app, settings.metrics_port)
    app.run()
    return 0 if app.healthy else 1


def _cmd_tiers(args: argparse.Namespace) -> int:
    settings, app = _prepared_app(args)
    _serve_metrics(app, settings.metrics_port)
    app.run_tiers(tiers=args.tier or "all")
    return 0 if app.healthy else 1


def _print_demo(summary: dict[str, Any]) -> None:
    lateness = summary["lateness_ms"]
    rows = [
        ("records produced", summary["records"]),
        ("succeeded first try", summary["succeeded_first_try"]),
        ("succeeded after retry", summary["succeeded_after_retry"]),
        *[(f"dead-lettered: {reason}", count) for reason, count in summary["dead_lettered"].items()],
        ("lost", summary["lost"]),
        ("duplicates suppressed", summary["duplicates_suppressed"]),
        ("handler calls", summary["handler_calls"]),
        ("calls before due time", summary["early_calls"]),
        ("lateness p50 / p99 / max", f"{lateness['p50']} / {lateness['p99']} / {lateness['max']} ms"),
        ("start-up", f"{summary['startup_s']} s (broker, topics, every consumer in its group)"),
        ("run time", f"{summary['wall_s']} s (first order produced to last accounted for)"),
    ]
    on = summary.get("broker") or summary["bootstrap"]
    print(f"\nretrytopics demo on {on}  (source {summary['topics']['source']})")
    for label, value in rows:
        print(f"  {label:<28} {value}")
    if summary.get("metrics"):
        print(f"  {'metrics (Prometheus)':<28} {summary['metrics']}  (deploy/grafana/retrytopics.json: the dashboard)")
    audit = summary.get("audit")
    if audit and audit.get("table"):
        print("\nSpark audit of the pipeline:\n" + audit["table"])


def _cmd_demo(args: argparse.Namespace) -> int:
    from retrytopics.operator.demo import DemoOptions, run_demo
    from retrytopics.operator.logs import configure_logging

    configure_logging(args.log_level or "WARNING")
    options = DemoOptions(
        records=args.records,
        partitions=args.partitions,
        delays=tuple(args.delays),
        seed=args.seed,
        bootstrap=args.bootstrap,
        broker=args.broker,
        spark=not args.no_spark,
        timeout_s=args.timeout,
        metrics_port=args.metrics_port,
    )
    if args.console:
        preflight.require_extra("console", True, "starlette", "console")

    def report(summary: dict[str, Any], kafka: Any) -> None:
        if args.json:
            summary.get("audit", {}).pop("table", None)
            print(json.dumps(summary, sort_keys=True), flush=True)
        else:
            _print_demo(summary)
        if args.console:
            _demo_console(summary, kafka)
        elif not args.json:
            print(f"\nNext, see this run in the browser: {_demo_console_command(summary, options)}")

    summary = run_demo(options, then=report)
    return 0 if summary["lost"] == 0 and summary["early_calls"] == 0 else 1


def _demo_console_command(summary: dict[str, Any], options: Any) -> str:
    """The command that shows the demo's pipeline in the console: on a cluster of the user's, the console
    itself; on a local broker, which stops with the demo, the demo again with --console."""
    if options.bootstrap:
        return (
            f"retrytopics console --bootstrap {options.bootstrap} --topic {summary['topics']['source']} "
            f"--group demo --delays {','.join(summary['delays'])}"
        )
    broker = "" if options.broker == "tansu" else f" --broker {options.broker}"
    return f"retrytopics demo --console{broker} --no-spark  (keeps its broker up and serves the console)"


def _demo_console(summary: dict[str, Any], kafka: Any) -> None:
    from retrytopics.console import serve
    from retrytopics.console.web import ConsoleOptions
    from retrytopics.operator.config import AppSettings

    pipeline = AppSettings(topic=summary["topics"]["source"], group="demo", delays=tuple(summary["delays"]))
    print(flush=True)
    serve(kafka, pipeline, ConsoleOptions(), port=8765)


def _cmd_spark_job(args: argparse.Namespace) -> int:
    from retrytopics.operator.ops import pipeline_topics

    if getattr(args, "chart", None):
        preflight.require_extra("chart", args.chart, "matplotlib", "spark")
    kafka, pipeline = preflight.pipeline_of(getattr(args, "app", None), _settings(args))
    from retrytopics.spark.session import spark_progress

    # progress on a terminal only: never in --json output, a pipe or a log file
    args.header_keys = pipeline.header_keys  # signed retry headers: the replay verifies and signs with them
    with spark_progress(sys.stderr, enabled=not (args.json or args.no_progress)):
        return int(args.spark_job(args, kafka=kafka, topics=pipeline_topics(pipeline)))


def _add_spark_jobs(commands: Any) -> None:
    """`audit` and `replay` need the `spark` extra; without it they exist but explain how to get it."""
    audit = commands.add_parser("audit", help="Spark audit of a retry pipeline (stages, overdue, DLQ, lineage)")
    _common(audit, pipeline=True)
    try:
        from retrytopics.spark.audit import add_audit_arguments, run_audit_cli
    except ImportError as exc:
        missing = str(exc)
        audit.set_defaults(run=lambda _args: _need_spark(missing))
        replay = commands.add_parser("replay", help="Spark job: republish selected DLQ records (needs the spark extra)")
        replay.set_defaults(run=lambda _args: _need_spark(missing))
        return
    add_audit_arguments(audit)
    audit.set_defaults(run=_cmd_spark_job, spark_job=run_audit_cli)
    from retrytopics.spark.replay import add_replay_arguments, run_replay_cli

    replay = commands.add_parser("replay", help="Spark job: republish selected DLQ records, idempotent per replay id")
    _common(replay, pipeline=True)
    add_replay_arguments(replay)
    replay.set_defaults(run=_cmd_spark_job, spark_job=run_replay_cli)
    for job in (audit, replay):
        job.add_argument("--no-progress", action="store_true", help="no progress line (shown on a terminal only)")


def _need_spark(missing: str) -> int:
    print(
        f"retrytopics: this command needs the spark extra: pip install 'retrytopics[spark]' ({missing})",
        file=sys.stderr,
    )
    return 2


def _common(parser: argparse.ArgumentParser, *, pipeline: bool = False) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML settings file (default: $RETRYTOPICS_CONFIG)")
    parser.add_argument("--bootstrap", metavar="HOST:PORT[,...]", help="Kafka bootstrap servers")
    parser.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--log-json", action="store_true", help="log one JSON object per line")
    if pipeline:
        parser.add_argument(
            "--app",
            metavar="MODULE:OBJECT",
            help="take topic, group, delays and Kafka settings from this RetryApp (the options below override it)",
        )
        parser.add_argument("--topic", help="source topic")
        parser.add_argument("--group", help="consumer group that owns the retries")
        parser.add_argument(
            "--delays",
            type=lambda s: [d for d in s.split(",") if d],
            metavar="5s,30s,5m",
            help="tier delays (required unless given in [app] or by --app)",
        )
        parser.add_argument("--naming", choices=["by_delay", "by_index", "shared"])
        parser.add_argument("--dlq", help="DLQ topic name (default from the naming strategy)")


def _add_topics(commands: Any) -> None:
    topics = commands.add_parser("topics", help="provision or describe the tier topics and DLQ of a pipeline")
    actions = topics.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create missing tier and DLQ topics (idempotent)")
    _common(create, pipeline=True)
    create.add_argument("--partitions", type=int, help="partitions of tier and DLQ topics (default: source's)")
    create.add_argument(
        "--replication-factor",
        type=int,
        metavar="N",
        help="replicas of each new topic (default: the broker's default.replication.factor)",
    )
    create.add_argument(
        "--min-insync-replicas",
        type=int,
        metavar="N",
        help="min.insync.replicas of each new topic (default: the broker's)",
    )
    create.add_argument(
        "--create-source", action="store_true", help="also create the source topic (needs --partitions)"
    )
    create.add_argument(
        "--no-broker-dlq",
        dest="broker_dlq",
        action="store_false",
        help="share-group pipelines ([app] consumer = share): do not set the broker's own DLQ, dlq.<group> "
        "(Kafka 4.4+, KIP-1191; docs/operations.md)",
    )
    create.set_defaults(run=_cmd_topics_create)
    describe = actions.add_parser("describe", help="offsets, lag, waiting/overdue state and replicas per partition")
    _common(describe, pipeline=True)
    describe.add_argument(
        "--grace",
        type=_duration_ms,
        default="30s",
        metavar="DURATION",
        help="how long past due a head record is overdue (default 30s)",
    )
    describe.add_argument("--json", action="store_true")
    describe.set_defaults(run=_cmd_topics_describe)


def _add_guard(commands: Any) -> None:
    guard = commands.add_parser(
        "guard", help="open or close a handler's retry-flood guard by hand, in every process of the app"
    )
    actions = guard.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (
        ("open", "open it and keep it open (no call, no probe) until closed by hand"),
        ("close", "close it (calls ramp up), whether opened by hand or by failures"),
    ):
        parser = actions.add_parser(action, help=text)
        _common(parser, pipeline=True)
        parser.add_argument("handler", nargs="?", metavar="HANDLER", help="the handler's source topic (or --topic)")
        parser.add_argument("--reason", required=True, help="why (logged by every process; printable, at most 200)")
        parser.set_defaults(run=_cmd_guard)


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


def _add_runners(commands: Any) -> None:
    run = commands.add_parser("run", help="run the main consumer of an app (MODULE:OBJECT); SIGTERM drains")
    run.add_argument("app", metavar="MODULE:OBJECT", help="where the RetryApp lives, e.g. billing.consumers:app")
    _common(run)
    run.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    run.add_argument("--concurrency", type=int, metavar="N", help="handler calls in flight (docs/concurrency.md)")
    run.set_defaults(run=_cmd_run)
    tiers = commands.add_parser("tiers", help="run tier consumers of an app (all, or --tier ...); SIGTERM drains")
    tiers.add_argument("app", metavar="MODULE:OBJECT")
    tiers.add_argument("--tier", action="append", metavar="DELAY|TOPIC", help="a tier to run (repeatable; default all)")
    _common(tiers)
    tiers.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    tiers.add_argument("--concurrency", type=int, metavar="N", help="handler calls in flight (docs/concurrency.md)")
    tiers.set_defaults(run=_cmd_tiers)


def _cmd_console(args: argparse.Namespace) -> int:
    preflight.require_extra("console", True, "starlette", "console")
    if args.actions:  # the replay ledger it shares with `retrytopics replay` lives with the Spark jobs
        preflight.require_extra("console.actions", True, "pyspark", "spark")
    settings = _settings(args)
    kafka, pipeline = preflight.pipeline_of(args.app, settings)
    from retrytopics.console import app_renderer, console_token, serve
    from retrytopics.console.web import ConsoleOptions

    token = console_token(args.token_file, os.environ) if args.actions else None
    render = app_renderer(preflight.load_app(args.app), pipeline.topic) if args.app and pipeline.topic else None
    options = ConsoleOptions(
        host=args.host, actions=args.actions, token=token, render=render, header_keys=pipeline.header_keys
    )
    serve(kafka, pipeline, options, port=args.port, grace_ms=args.grace)
    return 0


def _add_console(commands: Any) -> None:
    console = commands.add_parser("console", help="the operator console in the browser: pipeline, DLQ, lineage, replay")
    _common(console, pipeline=True)
    console.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    console.add_argument("--port", type=int, default=8765, help="port to listen on (default 8765)")
    console.add_argument(
        "--grace",
        type=_duration_ms,
        default="30s",
        metavar="DURATION",
        help="how long past due a tier head record is overdue (default 30s)",
    )
    console.add_argument("--actions", action="store_true", help="allow replays from the page (needs a token)")
    console.add_argument(
        "--token-file",
        metavar="FILE",
        help="the operators' token, for --actions (or RETRYTOPICS_CONSOLE_TOKEN; at least 16 characters)",
    )
    console.set_defaults(run=_cmd_console)


def _add_demo(commands: Any) -> None:
    demo = commands.add_parser("demo", help="the whole pipeline on the embedded broker, with a flaky handler")
    demo.add_argument("--records", type=int, default=2000)
    demo.add_argument("--partitions", type=int, default=3)
    demo.add_argument("--delays", type=lambda s: [d for d in s.split(",") if d], default=["200ms", "500ms", "1s"])
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument(
        "--broker",
        choices=["tansu", "apache", "cluster"],
        default="tansu",
        help="local broker to start: tansu (embedded, starts in <1 s), apache (Apache Kafka, ~5 s) "
        "or cluster (3 Apache Kafka nodes, replication factor 3, ~10 s)",
    )
    demo.add_argument("--bootstrap", help="use this Kafka cluster instead of starting a local broker")
    demo.add_argument("--json", action="store_true", help="print one JSON summary object on stdout")
    demo.add_argument("--no-spark", action="store_true", help="skip the Spark audit at the end")
    demo.add_argument(
        "--console",
        action="store_true",
        help="then serve the console on the demo's pipeline (read-only, port 8765) until Ctrl-C",
    )
    demo.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve the demo app's Prometheus metrics on 127.0.0.1:PORT/metrics (printed; with --console, kept up)",
    )
    demo.add_argument("--timeout", type=_duration_ms, default="5m", metavar="DURATION", help="give up after this long")
    demo.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    demo.set_defaults(run=_cmd_demo)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("retrytopics")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="retrytopics", description="Non-blocking retries for Apache Kafka.")
    parser.add_argument("--version", action="version", version=f"retrytopics {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    broker = commands.add_parser(
        "broker", help="run a local broker (tansu or Apache Kafka) in the foreground for development"
    )
    broker.add_argument("--port", type=int, default=None, help="listen port (default: a free one)")
    broker.add_argument(
        "--kind",
        choices=["tansu", "apache", "cluster"],
        default="tansu",
        help="tansu (embedded, in memory), apache (Apache Kafka from the Maven cache) or cluster "
        "(3 Apache Kafka nodes; --port does not apply)",
    )
    broker.set_defaults(run=_cmd_broker)
    _add_topics(commands)
    _add_guard(commands)
    _add_dlq(commands)
    _add_runners(commands)
    _add_spark_jobs(commands)
    _add_demo(commands)
    _add_console(commands)
    return parser


def _report(exc: RetryTopicsError) -> None:
    logging.getLogger("retrytopics").debug("command failed", exc_info=True)
    print(f"retrytopics: {type(exc).__name__}: {exc}", file=sys.stderr)
    code = getattr(exc, "code", "")
    if code in preflight.UNREACHABLE:
        from retrytopics.connectors.kafka import last_client_error

        print(f"retrytopics: hint: {preflight.connection_hint(code, last_client_error())}", file=sys.stderr)


def _reader_gone() -> int:
    # Point stdout at /dev/null so that the interpreter's final flush does not fail a second time.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)  # inside: `--help | head -1` must not trace back either
        return int(args.run(args))
    except ConfigError as exc:
        print(f"retrytopics: configuration error: {exc}", file=sys.stderr)
        return 2
    except RetryTopicsError as exc:
        _report(exc)
        return 1
    except BrokenPipeError:
        return _reader_gone()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
