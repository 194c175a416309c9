"""The Orca screen reader, unchanged, speaks through a real speakd: headless under Xvfb and AT-SPI,
in a small GTK window, driven by ``xdotool`` keys, through a proxy that logs the SSIP traffic.
Speed is for ``speakd-tools bench screenreader``; this checks that it works."""

from __future__ import annotations

import re

import pytest

from speakd.audio import read_wav
from tests.daemon_proc import start_daemon, write_config
from tests.orca_session import OrcaDesktop, missing
from tests.ssip_harness import SsipClient
from tests.ssip_proxy import SsipProxy
from tests.waits import wait_until

TITLE = "The quick brown fox jumps over the lazy dog"

pytestmark = pytest.mark.skipif(
    bool(missing()), reason=f"Orca cannot run headless here, missing: {', '.join(missing())}"
)


def _finished(proxy: SsipProxy) -> set[tuple[int, int]]:
    return {(e.conn, e.msg_id) for e in proxy.events() if e.code in (702, 703)}


def _title_spoken(proxy: SsipProxy) -> bool:
    """Orca has said the whole window (the title's sentence to its END) and is quiet."""
    queued = proxy.messages()
    ended = {(e.conn, e.msg_id) for e in proxy.events() if e.code == 702}
    said = any("quick" in body for key, body in queued.items() if key in ended)
    return said and _quiet(proxy)


def _quiet(proxy: SsipProxy) -> bool:
    """Every message Orca queued has ended or been cancelled."""
    return set(proxy.messages()) <= _finished(proxy)


@pytest.fixture(scope="module")
def orca_run(tmp_path_factory: pytest.TempPathFactory):
    """Orca's focus announcement, typing and caret moves; yields the proxy, the WAV folder and
    the daemon."""
    tmp_path = tmp_path_factory.mktemp("orca")
    daemon = start_daemon(write_config(tmp_path, realtime=True))
    try:
        with SsipProxy(tmp_path / "orca.sock", tmp_path / "ssip.sock") as proxy:
            with OrcaDesktop(tmp_path / "desktop", tmp_path / "orca.sock", TITLE) as desktop:
                wait_until(proxy.messages, "Orca to say it is on", 60)
                desktop.focus()
                wait_until(lambda: _title_spoken(proxy), "Orca to say the window to its end", 60)
                spoken = len(_finished(proxy))
                desktop.type("ab")
                desktop.key("Left", "Right")
                wait_until(
                    lambda: len(_finished(proxy)) >= spoken + 3 and _quiet(proxy),
                    "Orca to echo the keys and fall quiet",
                    30,
                )
            yield proxy, tmp_path / "wav", daemon
    finally:
        daemon.stop()


def test_orca_speaks_through_speakd_and_nothing_is_refused(orca_run) -> None:
    proxy, wav, daemon = orca_run
    sent = [ln.text for ln in proxy.snapshot() if ln.sent]
    assert any(t.startswith("SET self CLIENT_NAME") and "orca" in t.lower() for t in sent)
    assert "SET self SSML_MODE on" in sent
    assert any(t.startswith("CHAR ") or t == "SPEAK" for t in sent)
    assert not proxy.refusals(), proxy.refusals()
    assert not re.search(r"\b(ERROR|Traceback)\b", daemon.log_text())
    assert any(e.code == 702 for e in proxy.events())
    assert any(p.stat().st_size > 1000 for p in wav.glob("ssip-*.wav")), "no audio written"


def test_orca_marks_arrive(orca_run) -> None:
    """Orca marks every word; each mark it asked for comes back as a 700 before the message ends."""
    proxy, _, _ = orca_run
    ended_or_cancelled = _finished(proxy)  # not what Orca says as it is shut down
    marked = {
        k: b for k, b in proxy.messages().items() if "<mark " in b and k in ended_or_cancelled
    }
    assert marked, "Orca sent no marked SPEAK"
    events = proxy.events()
    ended = 0
    for key, body in marked.items():
        mine = [e for e in events if (e.conn, e.msg_id) == key]
        names = re.findall(r'<mark name="([^"]*)"', body)
        got = [e.extra[0] for e in mine if e.code == 700]
        if any(e.code == 702 for e in mine):
            assert got == names, body
            ended += 1
        else:  # cancelled by the next key: its marks stop where the audio stopped
            assert any(e.code == 703 for e in mine)
            assert got == names[: len(got)], body
    assert ended, "no marked message was spoken to its end"


def test_orca_events_in_speech_dispatchers_order(orca_run) -> None:
    """BEGIN, then the marks, then END or CANCELED, for every message Orca saw through."""
    proxy, _, _ = orca_run
    events = proxy.events()
    for key in _finished(proxy) & set(proxy.messages()):
        codes = [e.code for e in events if (e.conn, e.msg_id) == key and e.code < 704]
        if 701 not in codes:  # cancelled before it started: only its 703
            assert codes == [703], (key, codes)
            continue
        assert codes[0] == 701 and codes[-1] in (702, 703), (key, codes)
        assert set(codes[1:-1]) <= {700}, (key, codes)


def test_orca_marked_sentence_lasts_as_long_as_unmarked(orca_run) -> None:
    """The window's sentence as Orca marked it (a mark before every word) and the same text
    without marks, at the settings Orca had set, give audio of the same length (within 2 %)."""
    proxy, wav, _ = orca_run
    ended = {(e.conn, e.msg_id) for e in proxy.events() if e.code == 702}
    key, body = next((k, b) for k, b in proxy.messages().items() if "quick" in b and k in ended)
    settings = [
        ln.text
        for ln in proxy.snapshot()
        if ln.sent and ln.conn == key[0] and ln.text.startswith("SET self ")
    ]
    settings = settings[: _sent_before(proxy, key)]
    with SsipClient(wav.parent / "ssip.sock", timeout=60) as c:
        for line in settings:
            assert c.code(line) < 300, line
        msg_id = c.speak(re.sub(r"<mark [^>]*/>", "", body))
        c.wait_event(702, msg_id, timeout=60)
    marked = read_wav(wav / f"ssip-{key[1]}.wav")
    unmarked = read_wav(wav / f"ssip-{msg_id}.wav")
    ratio = len(marked.pcm) / len(unmarked.pcm)
    assert abs(ratio - 1) <= 0.02, f"marked/unmarked duration {ratio:.3f}"


def _sent_before(proxy: SsipProxy, key: tuple[int, int]) -> int:
    """How many ``SET self`` lines Orca had sent on that connection before the message's
    SPEAK (the SPEAK answered with its id)."""
    count = 0
    sets_since_speak = 0
    for ln in proxy.snapshot():
        if ln.conn != key[0]:
            continue
        if ln.sent and ln.text.startswith("SET self "):
            count += 1
        elif ln.sent and ln.text == "SPEAK":
            sets_since_speak = count
        elif not ln.sent and ln.text == f"225-{key[1]}":
            return sets_since_speak
    raise AssertionError(f"no SPEAK answered with id {key[1]}")
