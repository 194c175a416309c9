"""Prompt packs over MQTT and fleet status, end to end: a real mosquitto, two real ``speakd serve``
processes on different sites that share the group site ``floor2``, a pack made by precompute with
the real voice, and ``speakd-tools pack publish`` / ``fleet status`` as an operator runs them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from speakd.cache.store import CacheStore
from speakd.cache.trust import encode_public
from speakd.mqtt.messages import PackChunk, PackManifest
from speakd_tools.cli import main as tools_main
from speakd_tools.fleet.broker import Session, broker_config
from speakd_tools.fleet.publish import publish_pack, read_pack, sign_manifest
from speakd_tools.precompute import Prompt, precompute
from tests.daemon_proc import DaemonProc, start_daemon, write_config
from tests.mosquitto import Mosquitto, Received, Watcher, free_port
from tests.test_cache_daemon import wait_until
from tests.test_mqtt import mqtt_toml
from tests.tone_engine import ToneEngine

PROMPTS = ("Lift doors closing.", "Second floor.")
CHUNK = 16 * 1024  # several chunks for a two-clip pack


@pytest.fixture(scope="module")
def watcher(broker: Mosquitto) -> Iterator[Watcher]:
    w = Watcher(broker, "speakd/#")
    yield w
    w.close()


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two prompts on the board's own (embedded) voice, made as an operator would."""
    work = tmp_path_factory.mktemp("pack")
    (work / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    out = work / "lift.db"
    args = ["--out", str(out), "--no-progress", "--threads", "1"]
    assert tools_main(["precompute", str(work / "prompts.txt"), *args]) == 0
    return out


def board_config(tmp: Path, broker: Mosquitto, site: str) -> Path:
    extra = 'site_ids = ["floor2"]\ndiscovery = false'
    return write_config(tmp, mqtt_toml(broker, site, extra))


def start_board(config: Path, watcher: Watcher, site: str) -> DaemonProc:
    since = watcher.mark()
    daemon = start_daemon(config)
    watcher.wait(f"speakd/{site}/availability", lambda m: m.payload == b"online", since)
    return daemon


@pytest.fixture(scope="module")
def boards(
    tmp_path_factory: pytest.TempPathFactory, broker: Mosquitto, watcher: Watcher
) -> Iterator[dict[str, DaemonProc]]:
    found: dict[str, DaemonProc] = {}
    for site in ("lobby", "hall"):
        config = board_config(tmp_path_factory.mktemp(site), broker, site)
        found[site] = start_board(config, watcher, site)
    yield found
    for daemon in found.values():
        assert daemon.stop() == 0, daemon.log_text()


def pack_state(state: str, pack_id: str | None = None):
    def match(m: Received) -> bool:
        body = m.json()
        return body["state"] == state and (pack_id is None or body["pack_id"] == pack_id)

    return match


def publish(broker: Mosquitto, pack: Path, site: str) -> str:
    url = f"mqtt://{broker.host}:{broker.port}"
    args = ["--broker", url, "--site", site, "--chunk-bytes", str(CHUNK)]
    assert tools_main(["pack", "publish", str(pack), *args]) == 0
    manifest, _ = read_pack(pack, "speakd", site, CHUNK)
    return manifest.pack_id


def cache_only(daemon: DaemonProc, text: str) -> dict:
    """The last event of a say that may only play from the cache (``not_cached`` otherwise)."""
    with daemon.client() as c:
        return list(c.say({"text": text, "cache_only": True, "priority": "message"}, wait=True))[-1]


def test_a_group_pack_reaches_both_boards_one_of_them_late_and_a_republish_is_a_noop(
    boards: dict[str, DaemonProc], broker: Mosquitto, watcher: Watcher, pack: Path, capsys
) -> None:
    lobby, hall = boards["lobby"], boards["hall"]
    assert cache_only(lobby, PROMPTS[0])["event"] == "error"  # not in the cache yet
    assert hall.stop() == 0  # away during the publish; its persistent session stays
    since = watcher.mark()
    pack_id = publish(broker, pack, "floor2")
    body = watcher.wait("speakd/lobby/pack", pack_state("ok", pack_id), since).json()
    assert body["from_site"] == "floor2" and body["installed"] == {"floor2": pack_id}
    assert body["clips"] == 2 and body["added"] == 2
    assert watcher.matching("speakd/lobby/pack", pack_state("importing", pack_id), since)
    assert all(cache_only(lobby, t).get("status") == "done" for t in PROMPTS)

    since = watcher.mark()
    boards["hall"] = hall = start_board(hall.config, watcher, "hall")
    watcher.wait("speakd/hall/pack", pack_state("ok", pack_id), since, timeout=60)
    assert all(cache_only(hall, t).get("status") == "done" for t in PROMPTS)
    with CacheStore(Path(hall.config.parent / "cache.db")) as store:
        pinned = {c.text for c in store.clips(pinned_only=True)}
    assert set(PROMPTS) <= pinned

    # the same pack again: both boards see the manifest, neither fetches nor imports
    since = watcher.mark()
    logs = {site: d.log_text().count("is already installed") for site, d in boards.items()}
    publish(broker, pack, "floor2")
    for site, daemon in boards.items():
        wait_until(
            lambda d=daemon, s=site: d.log_text().count("is already installed") > logs[s], 60
        )
    assert watcher.matching("speakd/+/pack", pack_state("importing"), since) == []

    capsys.readouterr()
    url = f"mqtt://{broker.host}:{broker.port}"
    assert tools_main(["fleet", "status", "--broker", url, "--json"]) == 0
    rows = {r["site"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"lobby", "hall"}
    for row in rows.values():
        assert row["online"] is True and row["pack"] == pack_id and row["pack_state"] == "ok"
        assert row["engine"] == "vits" and row["bundle"] and row["version"]
        assert row["hits"] >= 2 and row["installed"] == {"floor2": pack_id}
    assert rows["lobby"]["last_error"].startswith("not_cached: ")  # its first say, any front-end
    assert tools_main(["fleet", "status", "--broker", url]) == 0
    table = capsys.readouterr().out
    row = rf"^hall\s+yes\s+\S+\s+vits\s+\S+\s+{pack_id}\s+ok\s+\d+\s+\d+\s+[\d.]+\s+"
    row += rf"floor2={pack_id}$"
    assert re.search(row, table, re.M)


@pytest.fixture
def session(broker: Mosquitto) -> Iterator[Session]:
    with Session(broker_config(f"mqtt://{broker.host}:{broker.port}")) as s:
        yield s


def refused(watcher: Watcher, since: int, pack_id: str) -> dict:
    body = watcher.wait("speakd/lobby/pack", pack_state("error", pack_id), since, timeout=60).json()
    assert body["from_site"] == "lobby"
    return body


def test_a_corrupt_chunk_a_wrong_bundle_and_a_too_large_pack_are_refused_and_the_pack_stays(
    boards: dict[str, DaemonProc], watcher: Watcher, session: Session, pack: Path, tmp_path: Path
) -> None:
    """Runs after the rollout above (module order): lobby holds the floor2 pack."""
    lobby = boards["lobby"]
    installed = watcher.matching("speakd/lobby/pack", pack_state("ok"))[-1].json()["installed"]

    # a chunk altered on its way: the manifest's per-chunk sha256 catches it
    manifest, chunks = read_pack(pack, "speakd", "lobby", CHUNK)
    bundles = manifest.bundles
    chunks[1] = bytes([chunks[1][0] ^ 0xFF]) + chunks[1][1:]
    since = watcher.mark()
    publish_pack(session, manifest, chunks)
    body = refused(watcher, since, manifest.pack_id)
    assert body["reason"] == "corrupt_chunk: chunk 1 does not match the manifest"
    assert body["installed"] == installed

    # a pack made for another model (the tone engine's bundle)
    other = tmp_path / "tone.db"
    precompute([Prompt("Lift doors closing.")], other, ToneEngine, progress=False)
    manifest, chunks = read_pack(other, "speakd", "lobby", CHUNK)
    since = watcher.mark()
    publish_pack(session, manifest, chunks)
    body = refused(watcher, since, manifest.pack_id)
    assert body["reason"].startswith(
        "wrong_bundle: the pack is for tone-1, this board's voices are "
    )

    # larger than limits.max_pack_bytes (64 MiB by default): refused before any chunk is fetched
    size = 1 << 30
    huge = PackManifest("speakd", "lobby", "ab" * 8, "0" * 64, size, 1, bundles, size, ["0" * 64])
    since = watcher.mark()
    session.wait(session.publish(huge), huge.topic())
    body = refused(watcher, since, huge.pack_id)
    assert body["reason"] == (
        f"too_large: the pack has {size} bytes, limits.max_pack_bytes is {64 * 1024 * 1024}"
    )

    # none of it touched the pack the board holds
    assert body["installed"] == installed
    assert all(cache_only(lobby, t).get("status") == "done" for t in PROMPTS)
    assert not list(lobby.config.parent.glob(".pack-*"))  # no part file left behind


def test_a_fetch_missing_a_chunk_stays_importing_and_completes_when_published_again(
    boards: dict[str, DaemonProc], watcher: Watcher, session: Session, pack: Path
) -> None:
    """The same file for lobby's own site: a new pack there, whose clips lobby already holds."""
    manifest, chunks = read_pack(pack, "speakd", "lobby", CHUNK)
    since = watcher.mark()
    for i, chunk in enumerate(chunks[:-1]):  # the last chunk is lost on the way
        session.wait(session.publish(PackChunk(manifest, i, chunk)), manifest.chunk_topic(i))
    session.wait(session.publish(manifest), manifest.topic())
    watcher.wait("speakd/lobby/pack", pack_state("importing", manifest.pack_id), since)
    publish_pack(session, manifest, chunks)
    body = watcher.wait("speakd/lobby/pack", pack_state("ok", manifest.pack_id), since).json()
    assert body["installed"]["lobby"] == manifest.pack_id and "floor2" in body["installed"]
    assert body["clips"] == 2 and body["added"] == 0


# ---- the messages, without a broker --------------------------------------------------------


def test_pack_topics_parse_and_a_manifest_is_checked_field_by_field() -> None:
    from speakd.mqtt.topics import parse_pack_topic

    assert parse_pack_topic("speakd", "speakd/floor2/pack/manifest") == ("floor2", "", -1)
    assert parse_pack_topic("speakd", "speakd/floor2/pack/data/ab12/7") == ("floor2", "ab12", 7)
    for topic in ("speakd/floor2/pack", "speakd/floor2/pack/data/ab12/x", "other/a/pack/manifest"):
        assert parse_pack_topic("speakd", topic) is None
    good = PackManifest("speakd", "s", "ab" * 8, "c" * 64, 10, 1, ["b"], 4, ["d" * 64] * 3)
    assert PackManifest.from_dict("speakd", "s", good.to_dict()) == good
    for change, message in [
        ({"size": "10"}, "'size' must be int"),
        ({"pack_id": "../#"}, "lower-case hex"),
        ({"chunk_sha256": ["d" * 64] * 2}, "does not cover size"),
        ({"bundles": [1]}, "bundles must be strings"),
    ]:
        with pytest.raises(ValueError, match=message):
            PackManifest.from_dict("speakd", "s", {**good.to_dict(), **change})


def test_publish_refuses_a_site_that_is_not_one_topic_level(pack: Path, capsys) -> None:
    args = ["pack", "publish", str(pack), "--broker", "mqtt://127.0.0.1:1", "--site"]
    assert tools_main([*args, "floor2/#"]) == 2
    assert "is not one MQTT topic level" in capsys.readouterr().err


def test_a_board_with_trusted_keys_refuses_each_bad_pack_counts_it_and_keeps_playing(
    broker: Mosquitto,
    watcher: Watcher,
    session: Session,
    pack: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Unsigned, tampered, untrusted and replayed: each refused, counted by reason on /metrics,
    and the signed pack the board took first still plays from its cache."""
    key = Ed25519PrivateKey.generate()
    http = free_port()
    extra = (
        f'discovery = false\n[fleet]\ntrusted_keys = ["{encode_public(key.public_key())}"]\n'
        f'[http]\nlisten = "127.0.0.1:{http}"\n'
    )
    kiosk = start_board(
        write_config(tmp_path_factory.mktemp("kiosk"), mqtt_toml(broker, "kiosk", extra)),
        watcher,
        "kiosk",
    )
    try:
        manifest, chunks = read_pack(pack, "speakd", "kiosk", CHUNK)
        since = watcher.mark()
        publish_pack(session, sign_manifest(manifest, key, 100), chunks)
        watcher.wait("speakd/kiosk/pack", pack_state("ok", manifest.pack_id), since, timeout=60)

        other = tmp_path_factory.mktemp("other") / "tone.db"
        precompute([Prompt("Lift doors closing.")], other, ToneEngine, progress=False)
        evil, evil_chunks = read_pack(other, "speakd", "kiosk", CHUNK)
        attempts = {
            "unsigned_pack": evil,
            "bad_signature": replace(sign_manifest(evil, key, 200), name="kiosk-evil.db"),
            "untrusted_key": sign_manifest(evil, Ed25519PrivateKey.generate(), 300),
            "replayed": sign_manifest(evil, key, 99),
        }
        for reason, attempt in attempts.items():
            since = watcher.mark()
            publish_pack(session, attempt, evil_chunks)
            body = watcher.wait(
                "speakd/kiosk/pack", pack_state("error", evil.pack_id), since, timeout=60
            ).json()
            assert body["reason"].startswith(f"{reason}: ")
            assert body["installed"] == {"kiosk": manifest.pack_id}
        metrics = httpx.get(f"http://127.0.0.1:{http}/metrics", timeout=10).text
        for reason in attempts:
            line = f'speakd_pack_refusals_total{{reason="{reason}"}} 1.0'
            assert line in metrics.splitlines(), metrics
        assert all(cache_only(kiosk, t).get("status") == "done" for t in PROMPTS)
        assert "refused: untrusted_key: signed by" in kiosk.log_text()
    finally:
        assert kiosk.stop() == 0, kiosk.log_text()
