"""Key echo from the cache (daemon/frontends/ssip/keys.py): a real daemon prewarms the key-echo
pack after READY, and then Orca's key echo (SSIP ``CHAR`` at its lowercase and uppercase
pitches, a symbol at its punctuation level, a key name and a typed letter as marked SSML) plays
from the cache."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from speakd.audio.pitch import ssip_semitones
from speakd.frontends.ssip.keys import DONE_LINE, key_echo
from speakd_tools.precompute import Prompt, key_echo_prompts
from tests.daemon_proc import READY_LINE, start_daemon, write_config
from tests.ssip_harness import SsipClient
from tests.waits import wait_until


def cache_counters(sock: str) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(sock)
        s.sendall(json.dumps({"op": "status"}).encode() + b"\n")
        return json.loads(s.makefile("rb").readline())["source"]["cache"]


def test_the_list_is_what_a_screen_reader_says() -> None:
    pack = key_echo()
    assert {"a", "Z", "7", ".", "\\"} <= set(pack.chars)
    assert {"space", "backspace", "page down", "F12"} <= set(pack.keys)
    # what Orca sends alone, as it sends it (tests/test_orca.py's navigation)
    assert {"checked", "not checked", "text.", "left control"} <= set(pack.keys)
    assert all(len(c) == 1 for c in pack.chars)


def test_precompute_lists_the_pack_without_symbols() -> None:
    prompts = key_echo_prompts()
    assert Prompt("T", pitch=ssip_semitones(50)) in prompts
    assert Prompt("page up", pitch=ssip_semitones(10)) in prompts
    assert not [p for p in prompts if p.text in (".", "#")]  # said by name only in the daemon


def precompute(tmp_path: Path, config: Path, prompts: str) -> None:
    """A prompt pack of ``prompts`` (TOML), imported into ``config``'s cache."""
    (tmp_path / "prompts.toml").write_text(prompts)
    for cmd in (
        ["speakd_tools.precompute", str(tmp_path / "prompts.toml"), "--out", "pack.db"],
        ["speakd", "cache", "--config", str(config), "import", "pack.db"],
    ):
        r = subprocess.run(
            [sys.executable, "-m", *cmd], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0, r.stdout + r.stderr


ECHOES = 5  # what orca_echoes sends


def orca_echoes(ssip_path: Path) -> None:
    """Orca's key echo: ``CHAR`` at its uppercase and lowercase pitches, a symbol at its
    punctuation level, a key name and a typed letter as Orca 43 echoes them (SSML, a mark on the
    word)."""
    with SsipClient(ssip_path, timeout=30) as ssip:
        assert ssip.code("SET self CLIENT_NAME user:orca:main") == 208
        assert ssip.code("SET self PRIORITY message") == 202  # Orca's: each one plays
        assert ssip.code("SET self LANGUAGE en-US") == 201
        for pitch, char in ((50, "T"), (10, "t")):  # Orca's uppercase and lowercase voices
            assert ssip.code(f"SET self PITCH {pitch}") == 204
            assert ssip.code(f"CHAR {char}") == 225
        assert ssip.code("SET self PUNCTUATION most") == 205
        assert ssip.code("CHAR .") == 225
        assert ssip.code("SET self SSML_MODE on") == 219
        ssip.speak('<speak><mark name="0:9"/>backspace </speak>')
        ssip.speak('<speak><mark name="0:1"/>t </speak>')  # still at PITCH 10


def looked_up(counters: dict[str, Any]) -> int:
    return counters["hits"] + counters["misses"]


def test_orca_key_echo_is_a_cache_hit_after_the_prewarm(tmp_path: Path) -> None:
    config = write_config(tmp_path, prewarm_keys=True)  # at Orca's pitches, the defaults
    # two of the pack made by speakd-tools precompute: the daemon finds them, makes the rest
    precompute(
        tmp_path,
        config,
        f'[[prompt]]\ntext = "T"\npitch = {ssip_semitones(50)}\n'
        f'[[prompt]]\ntext = "backspace"\npitch = {ssip_semitones(10)}\n',
    )
    proc = start_daemon(config, ready_timeout=120)
    try:
        wait_until(lambda: DONE_LINE in proc.log_text(), "the key-echo prewarm", timeout=600)
        log = proc.log_text()
        assert log.index(READY_LINE) < log.index(DONE_LINE)  # READY did not wait for it
        done = re.search(
            rf"{DONE_LINE}: (\d+) clips already cached .*, \d+ synthesized, 0 skip", log
        )
        assert done and done.group(1) == "2", log[log.index(DONE_LINE) :]
        before = cache_counters(proc.socket)
        orca_echoes(tmp_path / "ssip.sock")

        def played() -> dict[str, Any]:
            now = cache_counters(proc.socket)
            return now if looked_up(now) >= looked_up(before) + ECHOES else {}

        after = wait_until(played, "the key echoes to be looked up", timeout=30)
        assert after["misses"] == before["misses"], (before, after)
        assert after["hits"] == before["hits"] + ECHOES
    finally:
        assert proc.stop() == 0, proc.log_text()
    # Another user's daemon, its own cache empty, with that cache as its shipped pack (as the
    # package ships the one its build made): key echo from the first key, nothing synthesized.
    user = tmp_path / "user"
    user.mkdir()
    shipped = str(tmp_path / "cache.db")
    config = write_config(user, prewarm_keys=True, shipped_pack=shipped)
    proc = start_daemon(config, ready_timeout=120)
    try:
        orca_echoes(user / "ssip.sock")  # at once: the prewarm has only begun, if at all
        wait_until(lambda: DONE_LINE in proc.log_text(), "the key-echo prewarm", timeout=120)
        done = re.search(
            rf"{DONE_LINE}: (\d+) clips already cached \((\d+) in the shipped pack\), "
            r"0 synthesized, 0 skipped",
            proc.log_text(),
        )
        assert done and done.group(1) == done.group(2), proc.log_text()
        status = cache_counters(proc.socket)
        assert status["misses"] == status["synth"] == status["stored"] == 0, status
        assert status["hits_shipped"] >= int(done.group(1)) + ECHOES, status  # and the fallback
    finally:
        assert proc.stop() == 0, proc.log_text()
