"""Configuration: defaults, validation naming the key, environment overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from speakd.config import ConfigError, load_config


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
