"""``speakd-tools precompute --ray``: a local Ray cluster makes the pack a single host makes.

The pack files differ in their bytes only where the store records when a clip was made
(``created``, ``last_used``); every row's key, text, voice, params, bundle, rate and audio are
compared, in the order the rows were written.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from speakd_tools.precompute import Prompt, precompute
from tests.tone_engine import ToneEngine

ray = pytest.importorskip("ray", reason="needs the host extra: pip install -e '.[host]'")

CONTENT = ("key", "text", "voice", "params", "bundle", "sample_rate", "encoding", "audio")


def rows(pack: Path) -> list[dict[str, Any]]:
    """Every clip's content in rowid order (the order precompute wrote them)."""
    with contextlib.closing(sqlite3.connect(pack)) as db:
        cursor = db.execute(f"SELECT {', '.join(CONTENT)} FROM clips ORDER BY rowid")
        return [dict(zip(CONTENT, row, strict=True)) for row in cursor]


def test_a_local_ray_cluster_makes_the_single_host_pack(tmp_path: Path) -> None:
    prompts = [
        Prompt(f"announcement {i} " + "word " * (i % 3), voice=voice)
        for i in range(8)
        for voice in ("low", "high")
    ]
    single = precompute(prompts, tmp_path / "single.db", ToneEngine, progress=False, batch_size=3)
    on_ray = precompute(
        prompts,
        tmp_path / "ray.db",
        ToneEngine,
        jobs=2,
        batch_size=3,
        progress=False,
        ray_address="local",
    )
    assert single.synthesized == on_ray.synthesized == 16 and on_ray.failed == []
    assert not ray.is_initialized()  # the cluster it started is shut down again
    assert rows(tmp_path / "single.db") == rows(tmp_path / "ray.db")
