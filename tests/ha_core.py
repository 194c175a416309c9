"""A real Home Assistant Core process for the tests, configured only through the APIs its UI
uses: onboarding over HTTP, config flows (Wyoming, MQTT), ``/api/tts_get_url`` and the TTS proxy
view, and the websocket (voices, Assist pipelines, entity states, services)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from tests.ha_venv import HaUnavailable, HaVenv
from tests.mosquitto import free_port
from tests.waits import wait_until

CLIENT_ID = "http://127.0.0.1/"  # onboarding's client: any URL (HA's own UI uses its origin)


def venv_or_skip(release: str, built: HaVenv | HaUnavailable) -> HaVenv:
    """The release's venv (``ha_venv.build_all``); without one, a skip with its reason, or a
    failure with CI=true."""
    if isinstance(built, HaVenv):
        return built
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Home Assistant {release}: {built}")
    pytest.skip(f"Home Assistant {release}: {built}")


@dataclass
class Fetched:
    status: int
    body: bytes


@dataclass
class HomeAssistant:
    venv: HaVenv
    config: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    token: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.config / "home-assistant.log"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def start(self) -> HomeAssistant:
        """Start HA with a configuration.yaml that only binds its HTTP port (no pip at runtime:
        ``--skip-pip`` makes a missing requirement an error, not a download)."""
        self.config.mkdir(parents=True, exist_ok=True)
        (self.config / "configuration.yaml").write_text(
            f"http:\n  server_host: 127.0.0.1\n  server_port: {self.port}\n"
            "logger:\n  default: info\n"
        )
        self.proc = subprocess.Popen(
            [self.venv.python, "-m", "homeassistant", "--config", self.config, "--skip-pip"],
            stdout=subprocess.DEVNULL,
            stderr=(self.config / "stderr.log").open("wb"),
            env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
        )
        wait_until(self._answers, f"Home Assistant {self.venv.release} to serve HTTP", 240)
        return self

    def _answers(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, (
            f"Home Assistant exited:\n{(self.config / 'stderr.log').read_text()[-3000:]}"
            f"\n{self.log_text()[-3000:]}"
        )
        try:
            return httpx.get(f"{self.url}/api/onboarding", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    # ---- onboarding and REST ------------------------------------------------------------------

    def onboard(self) -> None:
        """The first-run wizard's calls: the owner account, its token, the core config step."""
        r = httpx.post(
            f"{self.url}/api/onboarding/users",
            json={
                "client_id": CLIENT_ID,
                "name": "Test",
                "username": "test",
                "password": "test-password",
                "language": "en",
            },
            timeout=30,
        )
        r.raise_for_status()
        r = httpx.post(
            f"{self.url}/auth/token",
            data={
                "grant_type": "authorization_code",
                "code": r.json()["auth_code"],
                "client_id": CLIENT_ID,
            },
            timeout=30,
        )
        r.raise_for_status()
        self.token = r.json()["access_token"]
        self.post("/api/onboarding/core_config", {}).raise_for_status()

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(
            self.url + path,
            json=body,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=120,
        )

    def flow(self, handler: str, *steps: dict[str, Any]) -> dict[str, Any]:
        """A config flow as the UI runs it: start it, submit each form, return the last answer."""
        r = self.post("/api/config/config_entries/flow", {"handler": handler})
        r.raise_for_status()
        answer = r.json()
        for step in steps:
            r = self.post(f"/api/config/config_entries/flow/{answer['flow_id']}", step)
            r.raise_for_status()
            answer = r.json()
        return answer

    def tts_url(
        self, message: str, language: str | None = None, cache: bool = True, **options: Any
    ) -> httpx.Response:
        """``/api/tts_get_url`` for the Wyoming entity; WAV unless asked otherwise."""
        body: dict[str, Any] = {
            "engine_id": "tts.speakd",
            "message": message,
            "cache": cache,
            "options": {"preferred_format": "wav", **options},
        }
        if language is not None:
            body["language"] = language
        return self.post("/api/tts_get_url", body)

    def speak(self, message: str, language: str | None = None, **options: Any) -> Fetched:
        """What HA's media players get: the TTS proxy URL, fetched."""
        r = self.tts_url(message, language, **options)
        assert r.status_code == 200, r.text
        return self.fetch(self.url + r.json()["path"])

    def fetch(self, url: str) -> Fetched:
        r = httpx.get(url, timeout=180)
        return Fetched(r.status_code, r.content)

    def tts_files(self) -> dict[str, int]:
        """HA's own TTS file cache: name -> size."""
        folder = self.config / "tts"
        return {p.name: p.stat().st_size for p in folder.iterdir()} if folder.exists() else {}

    def clear_tts_cache(self) -> None:
        self.ws({"type": "call_service", "domain": "tts", "service": "clear_cache"})

    # ---- websocket ----------------------------------------------------------------------------

    def ws(self, *commands: dict[str, Any], until: str | None = None) -> list[Any]:
        """Send commands on one authenticated websocket; each one's result (and, with ``until``,
        every event of the last one up to the event whose type is ``until``)."""
        return asyncio.run(self._ws(commands, until))

    async def _ws(self, commands: tuple[dict[str, Any], ...], until: str | None) -> list[Any]:
        out: list[Any] = []
        async with aiohttp.ClientSession() as s, s.ws_connect(f"{self.url}/api/websocket") as ws:
            await ws.receive_json()  # auth_required
            await ws.send_json({"type": "auth", "access_token": self.token})
            assert (await ws.receive_json())["type"] == "auth_ok"
            for n, command in enumerate(commands, 1):
                await ws.send_json({"id": n, **command})
                while True:
                    msg = await asyncio.wait_for(ws.receive_json(), 180)
                    if msg.get("id") != n:
                        continue
                    if msg["type"] == "result":
                        assert msg["success"], msg
                        out.append(msg["result"])
                        if until is None or n < len(commands):
                            break
                    elif msg["type"] == "event":
                        out.append(msg["event"])
                        if msg["event"].get("type") == until:
                            break
        return out

    def state(self, entity_id: str) -> dict[str, Any] | None:
        r = httpx.get(
            f"{self.url}/api/states/{entity_id}",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        )
        return r.json() if r.status_code == 200 else None

    def call(self, domain: str, service: str, **data: Any) -> None:
        self.post(f"/api/services/{domain}/{service}", data).raise_for_status()


def wait_for_log(ha: HomeAssistant, text: str, timeout: float = 60) -> None:
    wait_until(lambda: text in ha.log_text(), f"{text!r} in Home Assistant's log", timeout)
