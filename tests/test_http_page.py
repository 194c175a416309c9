"""The page at ``/`` in a real headless Chromium (Debian's ``chromium``): it asks for the token,
loads the voices and options, says a text on the board, plays one in the browser and shows the
status and the cache. The screenshot stays in the test's tmp directory (the path is printed)."""

from __future__ import annotations

import fnmatch
import json
import tomllib
from pathlib import Path

import pytest

from speakd.audio import read_wav
from tests.cdp import chromium
from tests.http_daemon import start_http_daemon


async def test_the_page_loads_voices_says_plays_and_shows_status(tmp_path: Path) -> None:
    d = start_http_daemon(tmp_path / "daemon")
    try:
        async with chromium(tmp_path / "chromium") as page:
            await page.goto(d.url + "/")
            # Without the token the API answers 401, and the page says so.
            assert "unauthorized" in await page.wait_for(
                "document.querySelector('#log .error')?.textContent"
            )
            await page.evaluate(
                f"const t = document.getElementById('token'); t.value = {json.dumps(d.token)};"
                "t.dispatchEvent(new Event('change'))"
            )
            assert await page.wait_for("document.body.dataset.voices") == "1"
            voice = await page.evaluate("document.getElementById('voice').value")
            assert voice == "en_US-joe-medium"
            options = await page.evaluate(
                "[...document.querySelectorAll('#options input')].map(i => i.id)"
            )
            assert "opt-noise_scale" in options

            # On the board: the daemon's WAV sink gets the request the page names.
            await page.evaluate(
                "document.getElementById('text').value = 'Hello from the page.';"
                "document.getElementById('say').click()"
            )
            said = await page.wait_for("document.body.dataset.said", timeout=60)
            request_id, status = said.split()
            assert status == "done"
            played = read_wav(d.proc.config.parent / "wav" / f"{request_id}.wav")
            assert played.duration > 0.5

            # In the browser: Chromium decodes the WAV the page fetched.
            await page.evaluate("document.getElementById('play').click()")
            await page.wait_for("document.body.dataset.played", timeout=60)
            duration = await page.wait_for("document.getElementById('audio').duration", timeout=30)
            assert duration == pytest.approx(played.duration, abs=0.05)

            # The status panel: state, queue and cache figures.
            await page.wait_for("document.body.dataset.status === 'idle'", timeout=10)
            cache = await page.wait_for(
                "document.querySelector('#cache')?.innerText.includes('hits') &&"
                "document.querySelector('#cache').innerText"
            )
            assert "clips" in cache
            health = await page.evaluate("document.getElementById('health').textContent")
            assert "ok" in health
            shot = await page.screenshot(tmp_path / "page.png")
            print(f"screenshot: {shot}")
            assert shot.stat().st_size > 10_000
    finally:
        assert d.stop() == 0


def test_the_page_ships_as_package_data() -> None:
    """The daemon reads the page from the installed package (importlib.resources), so a wheel
    must carry every file of daemon/data/."""
    root = Path(__file__).resolve().parent.parent
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["speakd"]
    files = sorted((root / "daemon" / "data").iterdir())
    assert {"index.html", "index.js", "index.css"} <= {f.name for f in files}
    for f in files:
        assert any(fnmatch.fnmatch(f"data/{f.name}", g) for g in globs), f
