"""Debian's headless Chromium driven over the Chrome DevTools Protocol (one page, one command at
a time), on aiohttp's websocket client: enough to load a page, run JavaScript in it, wait for what
it shows and take a screenshot, without Selenium or a driver binary."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

FLAGS = [
    "--headless",
    "--no-sandbox",  # tests run as root
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--autoplay-policy=no-user-gesture-required",  # the page's "Play here" in a headless run
    "--window-size=1280,900",
    "--remote-debugging-port=0",
]


class CdpError(RuntimeError):
    pass


class Page:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        await self.ws.send_json({"id": msg_id, "method": method, "params": params})
        async for msg in self.ws:
            reply = json.loads(msg.data)
            if reply.get("id") == msg_id:  # events in between are not needed
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error']}")
                return reply.get("result", {})
        raise CdpError("Chromium closed the DevTools connection")

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
        )
        if "exceptionDetails" in result:
            raise CdpError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        """Poll ``expression`` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while not (value := await self.evaluate(expression)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:g} s for {expression}")
            await asyncio.sleep(0.1)
        return value

    async def goto(self, url: str) -> None:
        await self.send("Page.enable")
        await self.send("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete'")

    async def screenshot(self, path: Path) -> Path:
        shot = await self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


@asynccontextmanager
async def chromium(profile: Path) -> AsyncIterator[Page]:
    """A fresh headless Chromium (its own profile directory) and its first page."""
    binary = shutil.which("chromium")
    if binary is None:
        raise CdpError("no chromium: apt-get install chromium (the Makefile's TEST_APT has it)")
    profile.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=(profile / "chromium.log").open("wb"),
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.is_file() or not port_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (profile / "chromium.log").read_text(errors="replace")[-2000:]
                raise CdpError(f"chromium did not start its DevTools server: {log}")
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as r:
                targets = await r.json()
            url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
            async with session.ws_connect(url, max_msg_size=0) as ws:
                yield Page(ws)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
