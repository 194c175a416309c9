"""speakd's page as Home Assistant shows it: inside HA's frame, under
``/api/hassio_ingress/<token>/``, through a reverse proxy (tests/ingress_proxy.py) whose
requests speakd lets in without the token (``http.no_token_from``), in a real headless Chromium.

Every asset and API call goes through the prefix and succeeds; the panels work there: each
voice's sample plays, a spoken text shows up in the cached prompts, search finds it, it plays
from the cache, is pinned and re-synthesized; the last minutes' plot has a dot per request.
Screenshots at desktop and phone widths stay in the test's tmp directory (paths printed).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.cdp import Page, chromium
from tests.http_daemon import free_port, start_http_daemon
from tests.ingress_proxy import GATEWAY, IngressProxy
from tests.tiny_voices import tiny_multispeaker_voice

IN_FRAME = "document.getElementById('panel').contentWindow"


async def in_frame(page: Page, expression: str, timeout: float = 60) -> object:
    """Wait until ``expression``, run in the add-on's frame (same origin), is truthy."""
    return await page.wait_for(f"(() => {{ const w = {IN_FRAME}; const d = w.document; "
                               f"return {expression}; }})()", timeout)  # fmt: skip


async def click(page: Page, selector: str) -> None:
    await page.evaluate(f"{IN_FRAME}.document.querySelector({json.dumps(selector)}).click()")


async def shoot(page: Page, path: Path, width: int, height: int, mobile: bool) -> Path:
    await page.send(
        "Emulation.setDeviceMetricsOverride",
        width=width,
        height=height,
        deviceScaleFactor=1,
        mobile=mobile,
    )
    await page.evaluate("new Promise(r => setTimeout(r, 400))")  # one layout and paint
    shot = await page.screenshot(path)
    print(f"screenshot: {shot}")
    return shot


async def test_the_page_works_under_home_assistants_ingress(tmp_path: Path) -> None:
    voices = tmp_path / "daemon" / "voices"
    voices.mkdir(parents=True)
    tiny_multispeaker_voice(voices, "xx_XX-duo-low")
    d = start_http_daemon(tmp_path / "daemon", http=f'no_token_from = ["{GATEWAY}"]', sink="null")
    proxy = IngressProxy(d.url)
    try:
        base = await proxy.start(free_port())
        # the browser itself (127.0.0.1) still needs the token
        assert httpx.get(f"{d.url}/v1/status", timeout=10).status_code == 401
        async with chromium(tmp_path / "chromium") as page:
            await page.goto(f"{base}/hassio/ingress/speakd")
            assert await in_frame(page, "d.body.dataset.voices") == "2"  # no token typed
            assert await in_frame(page, "d.querySelectorAll('#voice-list li').length") == 2
            licences = await in_frame(page, "[...d.querySelectorAll('#voice-list .licence')]"
                                      ".map(l => l.textContent)")  # fmt: skip
            assert licences == ["CC0", "unknown"]
            await click(page, "#voice-list li[data-voice='xx_XX-duo-low'] button")
            assert await in_frame(page, "d.body.dataset.sampled") == "xx_XX-duo-low"

            await page.evaluate(
                f"{IN_FRAME}.document.getElementById('text').value = "
                "'Turn the kitchen lights off, please.';"
                f"{IN_FRAME}.document.getElementById('format').value = 'wav';"
                f"{IN_FRAME}.document.getElementById('play').click()"
            )
            await in_frame(page, "d.body.dataset.played")
            # the cached prompts: both texts are there; search finds one
            await in_frame(page, "Number(d.body.dataset.clips) >= 2")
            await page.evaluate(
                f"const s = {IN_FRAME}.document.getElementById('search'); s.value = 'please';"
                "s.dispatchEvent(new Event('input'))"
            )
            await in_frame(page, "d.body.dataset.clips === '1'")
            row = "#clips tbody tr"
            assert "kitchen lights" in await in_frame(page, f"d.querySelector('{row}').innerText")
            await click(page, f"{row} td.acts button:nth-child(1)")  # play from the cache
            key = await in_frame(page, "d.body.dataset.clipPlayed")
            await click(page, f"{row} td.acts button:nth-child(3)")  # pin
            await in_frame(page, f"d.querySelector('{row}').className === 'pinned'")
            pinned = httpx.get(f"{d.url}/v1/cache/clips?pinned=1", headers=d.auth, timeout=10)
            assert [c["key"] for c in pinned.json()["clips"]] == [key]
            await click(page, f"{row} td.acts button:nth-child(2)")  # re-synthesize
            assert await in_frame(page, "d.body.dataset.resynthesized") == "miss"
            assert await in_frame(page, f"d.querySelector('{row}')?.dataset.key") == key
            await in_frame(page, f"d.querySelector('{row}').className === 'pinned'")  # still
            # the plot: one dot per request, cache hits and syntheses told apart
            await in_frame(page, "Number(d.body.dataset.recent) >= 3")
            classes = "[...d.querySelectorAll('#plot circle')].map(c => c.getAttribute('class'))"
            dots = await in_frame(page, f"{classes}.sort().join(' ')")
            assert "synthesis" in dots, dots
            assert await in_frame(page, "d.getElementById('health').className") == "ok"

            # Every asset and API call went through the prefix and succeeded.
            assert proxy.seen, "nothing went through the proxy"
            assert all(p.startswith(proxy.prefix + "/") for _m, p, _s in proxy.seen)
            failed = [(m, p, s) for m, p, s in proxy.seen if s >= 400]
            assert failed == []
            fetched = {p.split("?")[0].removeprefix(proxy.prefix) for _m, p, _s in proxy.seen}
            for path in (
                "/",
                "/index.js",
                "/panels.js",
                "/index.css",
                "/v1/recent",
                "/v1/cache/clips",
                "/v1/audio/voices",
                "/v1/status",
                "/healthz",
            ):
                assert path in fetched, (path, sorted(fetched))  # fmt: skip

            # A key that is not there, or a pin that is not true/false: clear errors.
            clip = f"{d.url}/v1/cache/clips"
            for method, url, body, code in (
                ("POST", f"{clip}/{key}/pin", {"pinned": "yes"}, "bad_field"),
                ("POST", f"{clip}/nokey/pin", {"pinned": True}, "not_found"),
                ("DELETE", f"{clip}/nokey", None, "not_found"),
                ("GET", f"{clip}/nokey/audio", None, "not_found"),
            ):
                r = httpx.request(method, url, json=body, headers=d.auth, timeout=10)
                assert r.json()["error"]["code"] == code, (method, url, r.text)

            # Screenshots: the add-on's page at the prefix, desktop and phone.
            await page.goto(f"{base}{proxy.prefix}/")
            await page.wait_for("Number(document.body.dataset.recent) >= 3", 30)
            await page.wait_for("document.querySelectorAll('#voice-list li').length === 2")
            for name, size in {"desktop": (1280, 1500, False), "phone": (390, 2500, True)}.items():
                shot = await shoot(page, tmp_path / f"ingress-{name}.png", *size)
                assert shot.stat().st_size > 20_000
    finally:
        await proxy.close()
        assert d.stop() == 0
