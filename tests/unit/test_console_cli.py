"""`retrytopics console` as the CLI starts it (the server replaced by a recorder): the pipeline and the value
deserializer come from `--app`, actions need a token from a file or the environment and never from argv, and
bad settings exit 2 naming the field before any connection."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
import retrytopics.console as console
from retrytopics.console.entries import entry_of
from retrytopics.operator import cli

_names = itertools.count()


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, Any, Any]]:
    calls: list[tuple[Any, Any, Any]] = []
    monkeypatch.setattr(
        console, "serve", lambda kafka, pipeline, options, **kw: calls.append((kafka, pipeline, options))
    )
    return calls


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], str]:
    monkeypatch.chdir(tmp_path)

    def write() -> str:
        name = f"console_app_{next(_names)}"
        (tmp_path / f"{name}.py").write_text(
            "from retrytopics import KafkaConfig, RetryApp, RetryPolicy\n"
            "from retrytopics.connectors.serde import json_value\n"
            "app = RetryApp(kafka=KafkaConfig(bootstrap='code-host:1'), group='billing')\n"
            "@app.handler('orders', policy=RetryPolicy(delays=['1s']), value_deserializer=json_value)\n"
            "def handle(record): pass\n"
        )
        monkeypatch.delitem(sys.modules, name, raising=False)
        return f"{name}:app"

    return write


def test_the_app_gives_the_pipeline_and_renders_values_with_its_deserializer(
    app_module: Callable[[], str], served: list[tuple[Any, Any, Any]]
) -> None:
    assert cli.main(["console", "--app", app_module()]) == 0
    ((kafka, pipeline, options),) = served
    assert kafka.bootstrap == "code-host:1" and (pipeline.topic, pipeline.group, pipeline.delays) == (
        "orders",
        "billing",
        ("1s",),
    )
    assert options.host == "127.0.0.1" and not options.actions and options.token is None
    entry = entry_of(
        topic="orders.billing.dlq", partition=0, offset=3, timestamp_ms=0, key=None, value=b'{"amount": 12}', headers=[]
    )
    assert options.render(entry) == {"amount": 12}


def test_actions_take_the_token_from_a_file_or_the_environment(
    tmp_path: Path, served: list[tuple[Any, Any, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = ["console", "--bootstrap", "h:1", "--topic", "orders", "--group", "billing", "--delays", "1s"]
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file-0123456789\n")
    monkeypatch.setenv("RETRYTOPICS_CONSOLE_TOKEN", "from-the-environment-0123")
    assert cli.main([*pipeline, "--actions", "--token-file", str(token_file)]) == 0
    assert cli.main([*pipeline, "--actions"]) == 0
    assert [options.token for _, _, options in served] == ["from-a-file-0123456789", "from-the-environment-0123"]
    assert all(options.actions for _, _, options in served)


@pytest.mark.parametrize(
    ("flags", "field"),
    [(["--actions"], "console.token"), (["--actions", "--token-file", "/no/such/file"], "console.token_file")],
)
def test_actions_without_a_readable_token_exit_2_naming_it(
    flags: list[str],
    field: str,
    served: list[tuple[Any, Any, Any]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("RETRYTOPICS_CONSOLE_TOKEN", raising=False)
    argv = ["console", "--bootstrap", "h:1", "--topic", "orders", "--group", "billing", "--delays", "1s", *flags]
    assert cli.main(argv) == 2
    assert f"configuration error: {field}=" in capsys.readouterr().err and served == []
