"""What a reload (SIGHUP) must redo, judged from the configuration the daemon had and the new
one: the [engine] model loaded again, the sink replaced, the MQTT front-end made anew. Anything
else a reload applies in place (``service.Daemon.reload``)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from speakd.config import Config, EngineConfig

# [engine] keys the Guard wraps the model with: a change makes a new Guard, not a new model
GUARD_KEYS = ("fallback_text", "hang_timeout_s", "max_rtf", "breaker_failures", "breaker_reset_s")


def model_changed(old: EngineConfig, new: EngineConfig) -> bool:
    """The [engine] keys that need the model loaded again (the rest only re-wrap it)."""
    return _model_key(old) != _model_key(new)


def sink_changed(old: Config, new: Config) -> bool:
    return _sink_key(old) != _sink_key(new)


def mqtt_changed(old: Config, new: Config) -> bool:
    """[mqtt], [fleet] or the pack limit changed (the front-end also asks whether the files
    its credentials come from did: ``MqttFrontend.credentials_changed``)."""
    return (
        new.mqtt != old.mqtt
        or new.limits.max_pack_bytes != old.limits.max_pack_bytes
        or new.fleet != old.fleet
    )


def _sink_key(config: Config) -> Any:
    """What decides the sink: the remote speaker's site when there is one, else [audio]."""
    mqtt, audio = config.mqtt, config.audio
    if mqtt.enabled and mqtt.remote_speaker:
        return mqtt.remote_speaker
    return (audio.sink, audio.device, audio.wav_dir, audio.realtime)  # volume etc. need no new sink


def _model_key(config: EngineConfig) -> tuple[Any, ...]:
    return tuple(getattr(config, f.name) for f in fields(config) if f.name not in GUARD_KEYS)
