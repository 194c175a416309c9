"""Configuration: defaults, validation naming the key, environment overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from speakd.config import ENGINE_KINDS, ConfigError, load_config
from speakd.engines.registry import KINDS


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "speakd.toml"
    p.write_text(text)
    return p


def test_defaults_without_a_file() -> None:
    config = load_config(None, env={})
    assert config.engine.kind == "vits"
    assert config.engine.bundle == ""
    assert config.audio.sink == "sounddevice"
    assert config.limits.max_text_chars == 5000
    assert config.mqtt.enabled is False
    assert config.cache.ttl_jitter == 0.1


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("[mqtt]\nport = 0\n", "mqtt.port"),
        ('[mqtt]\nport = "1883"\n', "mqtt.port"),
        ('[audio]\nsink = "speaker"\n', "audio.sink"),
        ('[audio]\nsink = "wav"\n', "audio.wav_dir"),
        ('[engine]\nkind = "chattts"\n', "engine.bundle"),
        ("[engine]\nthreads = 0\n", "engine.threads"),
        ('[socket]\nmode = "rw"\n', "socket.mode"),
        ("[cache]\nttl_jitter = 2.0\n", "cache.ttl_jitter"),
        ("[limits]\nmax_queue = true\n", "limits.max_queue"),
        ("[limits]\nstream_wait_s = -1\n", "limits.stream_wait_s"),
        ('[limits]\nstream_wait_s = "soon"\n', "limits.stream_wait_s"),
        ("[engine]\nvoices = 3\n", "engine.voices"),
        ("[speakers]\nx = 1\n", "speakers"),
        ("engine = 3\n", "engine"),
        ("[engine\n", "not valid TOML"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, toml: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(write(tmp_path, toml), env={})


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[mqtt]\nport = 1883\nhost = 'broker'\n")
    config = load_config(path, env={"SPEAKD_MQTT_PORT": "1884", "SPEAKD_AUDIO_SINK": "null"})
    assert config.mqtt.port == 1884
    assert config.mqtt.host == "broker"
    assert config.audio.sink == "null"
    with pytest.raises(ConfigError, match=r"mqtt\.port \(from \$SPEAKD_MQTT_PORT\)"):
        load_config(path, env={"SPEAKD_MQTT_PORT": "many"})


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "absent.toml", env={})


def test_http_beyond_loopback_needs_a_token(tmp_path: Path) -> None:
    for listen in ("0.0.0.0:5500", ":5500", "[::]:5500", "speakd.local:5500"):
        with pytest.raises(ConfigError, match=r"http\.token: .*set http\.token_file"):
            load_config(None, env={"SPEAKD_HTTP_LISTEN": listen})
    for listen in ("127.0.0.1:5500", "localhost:5500", "[::1]:5500"):
        assert load_config(None, env={"SPEAKD_HTTP_LISTEN": listen}).http.token_value() is None
    token_file = tmp_path / "http-token"
    token_file.write_text("s3cret\n")
    config = load_config(
        write(tmp_path, f'[http]\nlisten = "0.0.0.0:5500"\ntoken_file = "{token_file}"\n'), env={}
    )
    assert config.http.address == ("0.0.0.0", 5500) and config.http.token_value() == "s3cret"
    env = {"SPEAKD_HTTP_LISTEN": "0.0.0.0:5500", "SPEAKD_HTTP_TOKEN": "from-env"}
    assert load_config(None, env=env).http.token_value() == "from-env"
    with pytest.raises(ConfigError, match=r"http\.listen: 'nope' is not HOST:PORT"):
        load_config(None, env={"SPEAKD_HTTP_LISTEN": "nope"})
    token_file.write_text("")
    with pytest.raises(ConfigError, match=r"http\.token_file: .* is empty"):
        load_config(
            None, env={"SPEAKD_HTTP_LISTEN": ":1", "SPEAKD_HTTP_TOKEN_FILE": str(token_file)}
        )


def test_config_names_every_engine_kind_the_registry_has() -> None:
    """speakd.config takes the kinds as data (it never imports the registry, which imports it): the
    two lists must stay one."""
    assert sorted(ENGINE_KINDS) == sorted(KINDS)
