"""Signed packs and packs that leave: the signature check, the replay check and the pin
bookkeeping on real SQLite files; the same over a real mosquitto with simulated boards (the
board's real ``PackReceiver``, ``speakd_tools.bench.fleet.fleet``); ``speakd cache import`` by hand;
the config and doctor; and the short version of ``speakd-tools bench fleet``."""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from speakd.cache.packs import (
    META_PACK,
    META_VERSION,
    SitePack,
    import_pack,
    install_pack,
    installed_packs,
)
from speakd.cache.store import CacheStore, Clip
from speakd.cache.trust import Trust, TrustError, encode_public
from speakd.cache.versions import FILE, PackVersions
from speakd.cli import main as speakd_main
from speakd.config import ConfigError, load_config
from speakd.lifecycle.doctor import WARN, _check_fleet
from speakd.mqtt.messages import PackManifest
from speakd_tools.bench.fleet import fleet as bench_fleet
from speakd_tools.bench.fleet.fleet import BUNDLE, Outcomes, SimBoard
from speakd_tools.cli import main as tools_main
from speakd_tools.fleet.broker import Session, broker_config
from speakd_tools.fleet.publish import publish_pack, read_pack, sign_manifest
from tests.daemon_proc import start_daemon, write_config
from tests.mosquitto import Mosquitto

CHUNK = 4096


def make_pack(path: Path, keys: list[str]) -> Path:
    with CacheStore(path, recover=False, ttl_s=0, max_bytes=1 << 40) as store:
        store.put_many(
            [
                Clip(
                    key=key,
                    text=f"say {key}",
                    voice="v",
                    params={"voice": "v"},
                    bundle=BUNDLE,
                    sample_rate=22050,
                    audio=hashlib.sha256(key.encode()).digest() * 200,
                    pinned=True,
                )
                for key in keys
            ]
        )
    return path


def pinned(store: CacheStore) -> set[str]:
    return {c.key for c in store.clips(pinned_only=True)}


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def trust(key: Ed25519PrivateKey) -> Trust:
    other = encode_public(Ed25519PrivateKey.generate().public_key())
    return Trust((other, encode_public(key.public_key())))  # a rotation: two keys trusted


# ---- on real SQLite files ----------------------------------------------------------------------


def test_a_sites_new_pack_unpins_only_the_clips_nothing_else_holds(tmp_path: Path) -> None:
    with CacheStore(tmp_path / "cache.db") as store:
        store.put(Clip("legacy", "t", "v", {}, BUNDLE, 22050, b"\0\0" * 10, pinned=True))
        import_pack(store, make_pack(tmp_path / "local.db", ["local", "a2"]))  # by hand
        other = SitePack("lobby", "0" * 16)
        install_pack(store, make_pack(tmp_path / "other.db", ["shared", "o"]), other)
        first = make_pack(tmp_path / "a.db", ["a1", "a2", "shared", "legacy"])
        done = install_pack(store, first, SitePack("floor2", "1" * 16))
        assert (done.added, done.clips, done.unpinned) == (1, 4, 0)
        second = make_pack(tmp_path / "b.db", ["b1"])
        done = install_pack(store, second, SitePack("floor2", "2" * 16))
        # a1 left; a2 (by hand), shared (lobby's pack) and legacy (pinned before tracking) stay
        assert done.unpinned == 1
        assert pinned(store) == {"legacy", "local", "a2", "shared", "o", "b1"}
        a1 = store.get("a1")
        assert a1 is not None and not a1.pinned and a1.expires is not None  # now the LRU's
        assert installed_packs(store) == {"lobby": "0" * 16, "floor2": "2" * 16}


def test_an_older_signed_version_is_a_replay_and_changes_nothing(tmp_path: Path) -> None:
    versions = PackVersions.in_state_dir(tmp_path / "state")
    with CacheStore(tmp_path / "cache.db") as store:
        a = SitePack("s", "a" * 16, 20)
        install_pack(store, make_pack(tmp_path / "a.db", ["a"]), a, versions)
        before = (pinned(store), store.meta(), versions.last("s"))
        for version in (19, 20):
            with pytest.raises(TrustError, match=r"^replayed: version \d+ for site s is not newer"):
                install_pack(
                    store,
                    make_pack(tmp_path / f"b{version}.db", ["b"]),
                    SitePack("s", "b" * 16, version),
                    versions,
                )
        assert (pinned(store), store.meta(), versions.last("s")) == before
        install_pack(store, tmp_path / "a.db", a, versions)  # the same: no replay
        install_pack(store, tmp_path / "b20.db", SitePack("s", "b" * 16, 21), versions)
        assert pinned(store) == {"b"} and versions.last("s") == (21, "b" * 16)


def test_verify_names_each_refusal(key: Ed25519PrivateKey, trust: Trust) -> None:
    manifest = PackManifest("speakd", "s", "ab" * 8, "c" * 64, 10, 1, ["b"], 10, ["d" * 64])
    signed = sign_manifest(manifest, key, 7).to_dict()
    assert trust.verify(signed, "s") == 7
    cases: list[tuple[dict, str, str]] = [
        (manifest.to_dict(), "s", "unsigned_pack"),
        ({**signed, "chunk_sha256": ["e" * 64]}, "s", "bad_signature"),
        ({**signed, "version": 8}, "s", "bad_signature"),
        (signed, "other-site", "bad_signature"),  # signed for s, published on another site
        (sign_manifest(manifest, Ed25519PrivateKey.generate(), 7).to_dict(), "s", "untrusted_key"),
    ]
    for body, site, reason in cases:
        with pytest.raises(TrustError) as refused:
            trust.verify(body, site)
        assert refused.value.reason == reason


def test_config_names_a_bad_trusted_key_and_doctor_warns_without_keys(
    tmp_path: Path, trust: Trust
) -> None:
    config = tmp_path / "speakd.toml"
    config.write_text(f'[fleet]\ntrusted_keys = ["{trust.keys[0]}", "AAAA"]\n')
    with pytest.raises(ConfigError, match=r"^fleet\.trusted_keys\[1\]: 'AAAA' is 3 bytes"):
        load_config(config, env={})
    config.write_text("[mqtt]\nenabled = true\n")
    ok, detail = _check_fleet(load_config(config, env={}))
    assert ok == WARN and "fleet] trusted_keys" in detail
    config.write_text(f'[mqtt]\nenabled = true\n[fleet]\ntrusted_keys = ["{trust.keys[0]}"]\n')
    assert _check_fleet(load_config(config, env={}))[0] is True


def test_cache_import_by_hand_checks_the_same_signature(
    tmp_path: Path, key: Ed25519PrivateKey, trust: Trust, capsys
) -> None:
    config = tmp_path / "speakd.toml"
    state = f'[state]\ndir = "{tmp_path / "state"}"\n'
    config.write_text(f"{state}[fleet]\ntrusted_keys = {json.dumps(list(trust.keys))}\n")
    db = tmp_path / "cache.db"
    pack = make_pack(tmp_path / "pack.db", ["p1", "p2"])
    args = ["cache", "--config", str(config), "--db", str(db), "import", str(pack)]
    assert speakd_main(args) == 1
    assert "refused: unsigned_pack: no signed manifest" in capsys.readouterr().err

    key_file = tmp_path / "ops"
    assert tools_main(["fleet", "keygen", str(key_file)]) == 0
    public = capsys.readouterr().out.splitlines()[1]
    config.write_text(f'{state}[fleet]\ntrusted_keys = ["{public}"]\n')
    sign = ["pack", "sign", str(pack), "--key", f"{key_file}.key", "--site", "lobby"]
    assert tools_main([*sign, "--version", "5"]) == 0
    manifest = Path(f"{pack}.manifest.json")
    body = json.loads(manifest.read_text())
    assert body["site"] == "lobby" and body["version"] == 5 and body["key"] == public

    manifest.write_text(json.dumps({**body, "version": 6}))  # tampered
    assert speakd_main(args) == 1
    assert "refused: bad_signature" in capsys.readouterr().err
    manifest.write_text(json.dumps(body))
    assert speakd_main(args) == 0
    with CacheStore(db) as store:
        assert pinned(store) == {"p1", "p2"}
        assert installed_packs(store) == {"lobby": body["pack_id"]}
    older = make_pack(tmp_path / "older.db", ["o"])
    assert tools_main(["pack", "sign", str(older), *sign[3:], "--version", "4"]) == 0
    assert speakd_main([*args[:-1], str(older)]) == 1
    assert "refused: replayed: version 4 for site lobby" in capsys.readouterr().err
    # The record is state, not cache: the cache deleted, the older pack is still a replay.
    for path in tmp_path.glob("cache.db*"):
        path.unlink()
    assert speakd_main([*args[:-1], str(older)]) == 1
    assert "refused: replayed: version 4 for site lobby" in capsys.readouterr().err
    assert (tmp_path / "state" / FILE).is_file()


def test_a_record_kept_in_the_cache_moves_to_the_state_and_still_refuses(
    tmp_path: Path, key: Ed25519PrivateKey, trust: Trust, capsys
) -> None:
    """A board upgraded from a speakd that kept the last signed version in the cache's meta
    table: the first import moves it, so an older pack is refused then and after the cache goes."""
    config = tmp_path / "speakd.toml"
    config.write_text(
        f'[state]\ndir = "{tmp_path / "state"}"\n'
        f"[fleet]\ntrusted_keys = {json.dumps(list(trust.keys))}\n"
    )
    db = tmp_path / "cache.db"
    with CacheStore(db) as store:  # as the older speakd left it after taking version 5
        store.set_meta(f"{META_PACK}lobby", "5" * 16)
        store.set_meta(f"{META_VERSION}lobby", "5")
    older = make_pack(tmp_path / "older.db", ["o"])
    manifest = sign_manifest(read_pack(older, "speakd", "lobby", CHUNK)[0], key, 4)
    Path(f"{older}.manifest.json").write_text(json.dumps({**manifest.to_dict(), "site": "lobby"}))
    args = ["cache", "--config", str(config), "--db", str(db), "import", str(older)]
    assert speakd_main(args) == 1
    assert "refused: replayed: version 4 for site lobby is not newer than 5" in (
        capsys.readouterr().err
    )
    assert PackVersions.in_state_dir(tmp_path / "state").last("lobby") == (5, "5" * 16)
    with CacheStore(db) as store:
        assert f"{META_VERSION}lobby" not in store.meta()  # moved, not copied
    db.unlink()
    assert speakd_main(args) == 1
    assert "refused: replayed" in capsys.readouterr().err


def test_the_daemon_moves_a_record_kept_in_the_cache_before_it_is_ready(tmp_path: Path) -> None:
    """The upgrade itself opens no replay window: the record is in the state directory before
    the daemon can take any pack, even if the cache is deleted right after."""
    config = write_config(tmp_path)
    with CacheStore(tmp_path / "cache.db") as store:
        store.set_meta(f"{META_PACK}lobby", "5" * 16)
        store.set_meta(f"{META_VERSION}lobby", "5")
    proc = start_daemon(config)
    try:
        assert PackVersions.in_state_dir(tmp_path / "state").last("lobby") == (5, "5" * 16)
    finally:
        assert proc.stop() == 0, proc.log_text()
    with CacheStore(tmp_path / "cache.db") as store:
        assert f"{META_VERSION}lobby" not in store.meta()


# ---- over a real mosquitto, with simulated boards ----------------------------------------------


class Fleet:
    """Boards acting on ``group``, and an operator's session to publish with."""

    def __init__(self, broker: Mosquitto, work: Path, trust: Trust, group: str, n: int) -> None:
        self.group = group
        self.outcomes = Outcomes()
        address = (broker.host, broker.port)
        self.boards = [
            SimBoard(i, address, work, trust, self.outcomes.record, sites=[group], name=group)
            for i in range(n)
        ]
        self.session = Session(broker_config(f"mqtt://{broker.host}:{broker.port}"))
        for board in self.boards:
            board.connect()
        assert all(b.subscribed.wait(10) for b in self.boards)

    def publish(
        self,
        pack: Path,
        sign_with: Ed25519PrivateKey | None,
        version: int | None = None,
        tamper: Callable[[PackManifest], PackManifest] = lambda m: m,
    ) -> PackManifest:
        """Publish and wait until every board reported on it (ok or refused)."""
        manifest, chunks = read_pack(pack, "speakd", self.group, CHUNK)
        if sign_with is not None:
            manifest = sign_manifest(manifest, sign_with, version)
        manifest = tamper(manifest)
        with self.outcomes.cond:
            self.outcomes.ok.pop(manifest.pack_id, None)
            self.outcomes.errors.pop(manifest.pack_id, None)
        publish_pack(self.session, manifest, chunks)
        assert self.outcomes.wait(manifest.pack_id, len(self.boards), 30)
        return manifest

    def close(self) -> None:
        self.session.close()
        for board in self.boards:
            board.close()


@pytest.fixture
def fleet(broker: Mosquitto, tmp_path: Path, trust: Trust, request) -> Iterator[Fleet]:
    f = Fleet(broker, tmp_path / "boards", trust, request.node.name[-20:].strip("_"), 3)
    yield f
    f.close()


def test_every_board_refuses_unsigned_tampered_untrusted_and_replayed_packs_and_keeps_its_own(
    fleet: Fleet, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    good = fleet.publish(make_pack(tmp_path / "a.db", ["a1", "a2"]), key, version=100)
    assert len(fleet.outcomes.ok[good.pack_id]) == 3
    evil = make_pack(tmp_path / "evil.db", ["evil"])

    def tampered(m: PackManifest) -> PackManifest:  # another file's hashes under the signature
        other, _ = read_pack(tmp_path / "a.db", "speakd", fleet.group, CHUNK)
        return replace(m, chunk_sha256=other.chunk_sha256, sha256=other.sha256, size=other.size)

    attempts = [
        ("unsigned_pack", lambda: fleet.publish(evil, None)),
        ("bad_signature", lambda: fleet.publish(evil, key, 200, tamper=tampered)),
        ("untrusted_key", lambda: fleet.publish(evil, Ed25519PrivateKey.generate(), 300)),
        ("replayed", lambda: fleet.publish(evil, key, 99)),
    ]
    for reason, attempt in attempts:
        manifest = attempt()
        refusals = fleet.outcomes.errors[manifest.pack_id]
        assert len(refusals) == 3 and all(r.startswith(f"{reason}: ") for r in refusals.values())
        for board in fleet.boards:
            assert board.refusals[reason] == 1
            assert installed_packs(board.store) == {fleet.group: good.pack_id}
            assert pinned(board.store) == {"a1", "a2"}
            assert board.store.get("a1") is not None
    assert all(sum(b.refusals.values()) == 4 for b in fleet.boards)
    # Each board's cache wiped (a new cache.path, `systemctl clean`, a damaged file moved aside):
    # the last version is in its state directory, so the older pack is still refused.
    for board in fleet.boards:
        board.store.close()
        for path in board.store.path.parent.glob("cache.db*"):
            path.unlink()
        board.store = CacheStore(board.store.path, max_bytes=1 << 30)
    replay = fleet.publish(evil, key, 99)
    assert all(r.startswith("replayed: ") for r in fleet.outcomes.errors[replay.pack_id].values())
    assert all(b.refusals["replayed"] == 2 and not installed_packs(b.store) for b in fleet.boards)


def test_ten_rollouts_leave_exactly_the_current_packs_pinned(
    fleet: Fleet, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    """Each board also holds its own site's pack and a clip imported by hand that rollout 3
    also carries; each rollout overlaps the one before by one clip."""
    own = ["own", "both"]
    for board in fleet.boards:
        pack = make_pack(tmp_path / f"own-{board.index}.db", own)
        install_pack(board.store, pack, SitePack(board.site, "f" * 16))
        import_pack(board.store, make_pack(tmp_path / f"hand-{board.index}.db", ["hand", "k3"]))
    for n in range(1, 11):
        keys = [f"k{n}", f"k{n + 1}", "both"]
        manifest = fleet.publish(make_pack(tmp_path / f"r{n}.db", keys), key, version=n)
        assert len(fleet.outcomes.ok[manifest.pack_id]) == 3, fleet.outcomes.errors
        for board in fleet.boards:
            assert pinned(board.store) == {*keys, *own, "hand", "k3"}, f"rollout {n}"
    stats = fleet.boards[0].store.stats()
    assert stats["pinned"] == 6 and stats["clips"] == 14  # k1…k11, both, own, hand


def test_bench_fleet_short(tmp_path: Path) -> None:
    args = argparse.Namespace(
        boards=20, per_process=10, pack_kb=32, clips=4, chunk_bytes=8192, timeout=60.0
    )
    result = bench_fleet.measure(args)
    for phase in ("rollout", "rollout_with_a_third_reconnecting"):
        figures = result[phase]
        assert figures["complete"] and figures["boards_ok"] == 20 and not figures["refused"]
        assert 0 < figures["s_to_50pct"] <= figures["s_to_99pct"] <= figures["s_to_100pct"]
        assert figures["broker_peak_rss_mb"] > 0 and figures["broker_bytes_sent_mb"] > 0
    assert result["pinned_is_current_pack_only"]
