"""The `retrytopics` command line. Argument parsing only; every command delegates to the library."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _cmd_broker(args: argparse.Namespace) -> int:
    from retrytopics.connectors.embedded import EmbeddedBroker

    with EmbeddedBroker(port=args.port) as broker:
        print(f"embedded Kafka broker (tansu) listening; bootstrap servers: {broker.bootstrap}", flush=True)
        print(f"log: {broker.log_path}; Ctrl-C to stop", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="retrytopics", description="Non-blocking retries for Apache Kafka.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    broker = commands.add_parser("broker", help="run the embedded broker in the foreground for local development")
    broker.add_argument("--port", type=int, default=None, help="listen port (default: a free one)")
    broker.set_defaults(run=_cmd_broker)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "broker":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
