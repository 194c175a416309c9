"""The page at ``/`` in a real headless Chromium (Debian's ``chromium``): it asks for the token,
loads the voices, options and chimes, says a text on the board (and one with a chime), plays
every format it offers in the browser, missed (streamed) and hit (whole), to the clip's length,
numbers its log in full and counts streams with the requests. The screenshot stays in the test's
tmp directory (the path is printed)."""

from __future__ import annotations

import fnmatch
import json
import tomllib
from pathlib import Path

import httpx
import pytest

import speakd
from speakd.audio import read_wav
from speakd.audio.encode import ENCODER_DELAY
from tests.cdp import Page, chromium
from tests.http_daemon import start_http_daemon
from tests.tiny_voices import tiny_multispeaker_voice


async def play(page: Page, text: str, fmt: str) -> tuple[str, float]:
    """Play ``text`` in ``fmt`` with the page's button: hit or miss, and Chromium's duration."""
    await page.evaluate(
        f"document.getElementById('format').value = {json.dumps(fmt)};"
        f"document.getElementById('text').value = {json.dumps(text)};"
        "delete document.body.dataset.played; document.getElementById('play').click()"
    )
    played = await page.wait_for("document.body.dataset.played", timeout=60)
    note = await page.evaluate("document.querySelector('#log li').textContent")
    assert played in note, note  # the newest entry is this one, not an error
    duration = await page.wait_for(
        "(a => isFinite(a.duration) && a.duration)(document.getElementById('audio'))", timeout=30
    )
    return ("hit" if "cache hit" in note else "miss"), duration


async def test_the_page_loads_voices_says_plays_and_shows_status(tmp_path: Path) -> None:
    (tmp_path / "daemon" / "voices").mkdir(parents=True)
    tiny_multispeaker_voice(tmp_path / "daemon" / "voices", "xx_XX-duo-low")
    # loudness off: the generated voice's speakers are told apart by their level (sid 1: 0.2)
    d = start_http_daemon(tmp_path / "daemon", env={"SPEAKD_AUDIO_LOUDNESS_LUFS": "0"})
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
            assert await page.wait_for("document.body.dataset.voices") == "2"
            voice = await page.evaluate("document.getElementById('voice').value")
            assert voice == "en_US-joe-medium"
            menu = await page.evaluate(
                "[...document.getElementById('voice').options].map(o => o.textContent)"
            )
            assert menu == [
                "en_US-joe-medium (vits; en-US; CC0)",
                "xx_XX-duo-low (vits; en-US; unknown)",  # no MODEL_CARD beside it
            ]
            options = await page.evaluate(
                "[...document.querySelectorAll('#options input')].map(i => i.id)"
            )
            assert "opt-noise_scale" in options
            speakers = "document.getElementById('speaker')"
            assert await page.evaluate(f"{speakers}.parentElement.hidden") is True
            # A multi-speaker voice shows its speakers; the board says it with the one chosen.
            await page.evaluate(
                "const v = document.getElementById('voice'); v.value = 'xx_XX-duo-low';"
                "v.dispatchEvent(new Event('change'));"
                f"{speakers}.value = 'bert';"
                "document.getElementById('text').value = 'Bert speaks.';"
                "document.getElementById('say').click()"
            )
            assert await page.evaluate(f"[...{speakers}.options].map(o => o.value)") == [
                "anna",
                "bert",
            ]
            said = await page.wait_for("document.body.dataset.said", timeout=60)
            assert said.split()[1] == "done"
            bert = read_wav(d.proc.config.parent / "wav" / f"{said.split()[0]}.wav")
            assert bert.sample_rate == 22050
            assert float(bert.samples().mean()) / 32767 == pytest.approx(0.2, abs=0.01)  # sid 1
            await page.evaluate(
                "const w = document.getElementById('voice'); w.value = 'en_US-joe-medium';"
                "w.dispatchEvent(new Event('change')); delete document.body.dataset.said"
            )

            # A chime from the menu (the daemon's list) plays first: loudness off, as shipped.
            chimes = await page.evaluate(
                "[...document.getElementById('chime').options].map(o => o.value)"
            )
            assert chimes == ["", "ding", "ding-dong", "attention"]
            await page.evaluate(
                "document.getElementById('chime').value = 'ding';"
                "document.getElementById('text').value = 'Chimed.';"
                "document.getElementById('say').click()"
            )
            said = await page.wait_for("document.body.dataset.said", timeout=60)
            assert said.split()[1] == "done"
            chimed = read_wav(d.proc.config.parent / "wav" / f"{said.split()[0]}.wav")
            ding = read_wav(Path(speakd.__file__).parent / "data" / "chime-ding.wav")
            assert chimed.pcm.startswith(ding.pcm) and len(chimed.pcm) > len(ding.pcm)
            await page.evaluate(
                "document.getElementById('chime').value = ''; delete document.body.dataset.said"
            )

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

            # Every format on the menu plays: a miss (streamed) and a hit (whole) as long as the
            # clip, within a frame (MP3's miss: plus LAME's delay and padding, docs/http.md).
            formats = await page.evaluate(
                "[...document.getElementById('format').options].map(o => o.value)"
            )
            assert formats == ["mp3", "opus", "flac", "wav", "pcm"]
            for fmt in formats:
                text = f"Every format plays in the browser. This one is {fmt}, a miss then a hit."
                miss, hit, clip = [await play(page, text, f) for f in (fmt, fmt, "wav")]
                assert (miss[0], hit[0], clip[0]) == ("miss", "hit", "hit"), fmt
                late = (ENCODER_DELAY + 2 * 576) / 22050 if fmt == "mp3" else 0.0
                assert -0.03 < miss[1] - clip[1] < 0.03 + late, (fmt, miss, clip)
                assert hit[1] == pytest.approx(clip[1], abs=0.03), (fmt, hit, clip)

            # The log numbers every entry in full (it clipped 10 to ".0"), newest first.
            numbers = await page.evaluate(
                "const log = document.getElementById('log').getBoundingClientRect();"
                "[...document.querySelectorAll('#log li .n')].map(n =>"
                " [n.textContent, n.getBoundingClientRect().left >= log.left])"
            )
            assert len(numbers) > 10
            assert numbers == [[str(n), True] for n in range(len(numbers), 0, -1)]

            # The status panel: state, queue and cache figures; streams counted as requests.
            await page.wait_for("document.body.dataset.status === 'idle'", timeout=10)
            cache = await page.wait_for(
                "document.querySelector('#cache')?.innerText.includes('hits') &&"
                "document.querySelector('#cache').innerText"
            )
            assert "clips" in cache
            s = d.status()
            said, streamed = s["counters"]["accepted"], s["streams"]["streams"]
            assert streamed >= 3 * len(formats) + 1
            requests = await page.wait_for(
                "document.querySelector('#status').innerText.includes('streamed back') &&"
                "document.querySelector('#status').innerText"
            )
            assert f"{said + streamed}: {said} said, {streamed} streamed back" in requests
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
    ]["speakd.data"]
    files = sorted((root / "daemon" / "data").iterdir())
    assert {"index.html", "index.js", "index.css"} <= {f.name for f in files}
    for f in files:
        assert any(fnmatch.fnmatch(f.name, g) for g in globs), f


async def test_resynthesize_keeps_every_parameter_and_the_pin(tmp_path: Path) -> None:
    """The page's ↻ on a pinned Piper clip made with a speaker, a speed (its length_scale), a
    pitch and an engine option, and on one made from SSML prosody: the daemon makes each anew
    from what it was made with, so the new clip has the same key and parameters, and is still
    pinned (it used to drop all but text, voice and speed, delete the clip, then 404 re-pinning)."""
    (tmp_path / "daemon" / "voices").mkdir(parents=True)
    tiny_multispeaker_voice(tmp_path / "daemon" / "voices", "xx_XX-duo-low")
    d = start_http_daemon(tmp_path / "daemon")
    api = f"{d.url}/v1"

    def clips(text: str) -> list[dict]:
        r = httpx.get(f"{api}/cache/clips", params={"q": text}, headers=d.auth, timeout=30)
        return r.json()["clips"]

    asked = {
        "plain": {"input": "Bert, slowly and higher.", "voice": "xx_XX-duo-low", "speaker": "bert",
                  "speed": 1.3, "pitch": 2.0, "params": {"noise_scale": 0.5}},
        "ssml": {"input": '<speak><prosody rate="slow" pitch="+2st">Marked up, slowly.</prosody>'
                 "</speak>", "voice": "xx_XX-duo-low"},
    }  # fmt: skip
    before = {}
    try:
        for name, body in asked.items():
            r = httpx.post(f"{api}/audio/speech", json={**body, "response_format": "wav"},
                           headers=d.auth, timeout=60)  # fmt: skip
            assert r.status_code == 200, r.text
            text = "Bert, slowly" if name == "plain" else "Marked up"
            [clip] = clips(text)
            r = httpx.post(f"{api}/cache/clips/{clip['key']}/pin", json={"pinned": True},
                           headers=d.auth, timeout=30)  # fmt: skip
            assert r.status_code == 200, r.text
            before[name] = (text, {**clip, "pinned": True})
        params = json.loads(before["plain"][1]["params"])
        assert params["voice"] == "xx_XX-duo-low#bert" and params["pitch"] == 2.0
        assert params["noise_scale"] == 0.5 and params["length_scale"] < 1.0
        assert "pitch" in json.loads(before["ssml"][1]["params"])

        async with chromium(tmp_path / "chromium") as page:
            await page.goto(d.url + "/")
            await page.evaluate(
                f"const t = document.getElementById('token'); t.value = {json.dumps(d.token)};"
                "t.dispatchEvent(new Event('change'))"
            )
            errors = "document.querySelectorAll('#log .error').length"  # 401s before the token
            logged = None
            for text, old in before.values():
                row = f"#clips tbody tr[data-key={json.dumps(old['key'])}]"
                await page.wait_for(f"!!document.querySelector('{row}')", timeout=30)
                logged = logged if logged is not None else await page.evaluate(errors)
                await page.evaluate(
                    "delete document.body.dataset.resynthesizedKey;"
                    f"document.querySelector('{row} td.acts button:nth-child(2)').click()"
                )
                key = await page.wait_for(  # the new clip's key, or the error the page logs
                    "document.body.dataset.resynthesizedKey || "
                    f"({errors} > {logged} && document.querySelector('#log .error').textContent)",
                    timeout=60,
                )
                assert key == old["key"]
                await page.wait_for(f"document.querySelector('{row}')?.className === 'pinned'")
                [new] = clips(text)
                assert new["last_used"] > old["last_used"]  # made anew, not left as it was
                same = ("key", "text", "voice", "params", "pinned")
                assert {k: new[k] for k in same} == {k: old[k] for k in same}
            assert await page.evaluate(errors) == logged
    finally:
        assert d.stop() == 0
