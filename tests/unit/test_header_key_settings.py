"""Header keys for the CLI: `[app] header_key_file`, `RETRYTOPICS_APP_HEADER_KEY`, or the
replay's `--header-key-file`, in the usual precedence (file < environment < flags); never a key on argv; a
short key fails at start-up naming the setting, without showing the key; `--app` brings the app's own keys.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from retrytopics.core.errors import ConfigError
from retrytopics.core.signing import HeaderKeys
from retrytopics.operator.config import load_settings

NEW, OLD = "n" * 40, "o" * 40


def _keys(tmp_path: Path, name: str, *keys: str) -> str:
    path = tmp_path / name
    path.write_text("\n".join(keys) + "\n")
    return str(path)


def test_a_key_file_lists_keys_one_per_line_the_first_signing(tmp_path: Path) -> None:
    toml = tmp_path / "rt.toml"
    toml.write_text(f'[app]\nheader_key_file = "{_keys(tmp_path, "keys", NEW, OLD)}"\n')
    settings = load_settings(path=toml, environ={})
    assert settings.app.header_keys == HeaderKeys.of([NEW, OLD])
    assert NEW not in repr(settings) and OLD not in repr(settings.app)


def test_precedence_file_then_environment_then_flags(tmp_path: Path) -> None:
    toml = tmp_path / "rt.toml"
    toml.write_text(f'[app]\nheader_key_file = "{_keys(tmp_path, "file", "f" * 32)}"\n')
    env = {"RETRYTOPICS_APP_HEADER_KEY": f"{NEW},{OLD}"}
    assert load_settings(path=toml, environ=env).app.header_keys == HeaderKeys.of([NEW, OLD])
    flag = {"app": {"header_key_file": _keys(tmp_path, "flag", "g" * 32)}}
    assert load_settings(path=toml, environ=env, flags=flag).app.header_keys == HeaderKeys.of("g" * 32)
    assert load_settings(environ={}).app.header_keys is None


def test_a_key_is_never_taken_from_the_command_line() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={}, flags={"app": {"header_key": NEW}})
    assert caught.value.field == "app.header_key" and NEW not in str(caught.value)


@pytest.mark.parametrize(
    "env, field",
    [
        ({"RETRYTOPICS_APP_HEADER_KEY": "short-secret"}, "app.header_key"),
        ({"RETRYTOPICS_APP_HEADER_KEY": f"{NEW},short-secret"}, "app.header_key[1]"),
    ],
)
def test_a_short_key_fails_naming_the_setting_without_showing_it(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ=env)
    assert caught.value.field == field
    assert "short-secret" not in str(caught.value) and "short-secret" not in repr(caught.value.value)


def test_an_unreadable_key_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={"RETRYTOPICS_APP_HEADER_KEY_FILE": str(tmp_path / "missing")})
    assert caught.value.field == "app.header_key_file"


def test_the_replay_flag_is_a_file_path_never_a_key() -> None:
    pytest.importorskip("pyspark")
    from retrytopics.spark.replay import add_replay_arguments

    parser = argparse.ArgumentParser()
    add_replay_arguments(parser)
    args = parser.parse_args(["--replay-id", "r1", "--header-key-file", "/run/secrets/retry-key"])
    assert args.header_key_file == "/run/secrets/retry-key"
    assert not any(a.dest == "header_key" for a in parser._actions)
