"""The published-build cache: lookup marks use, publishing keeps the first build, eviction is LRU
within the cap and never touches a build in use or Triton's base layer."""

from __future__ import annotations

import os
import time
from pathlib import Path

from reward_svc.build_cache import BuildCache


def _build(root: Path, name: str, size: int) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / "lib.so").write_bytes(b"x" * size)
    return path


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_publish_then_lookup_marks_the_build_used(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path / "cache", max_bytes=10_000)
    cache.root.mkdir()
    assert cache.lookup("src") is None
    cache.publish(_build(tmp_path / "work", "a", 10), "src")
    found = cache.lookup("src")
    assert found == cache.path_for("src") and (found / "lib.so").read_bytes() == b"x" * 10
    _age(found, 7200)
    cache.lookup("src")
    assert time.time() - found.stat().st_mtime < 60


def test_a_second_publisher_of_the_same_source_leaves_the_first_build(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path / "cache", max_bytes=10_000)
    cache.root.mkdir()
    cache.publish(_build(tmp_path / "w1", "a", 10), "src")
    cache.publish(_build(tmp_path / "w2", "b", 20), "src")
    assert (cache.path_for("src") / "lib.so").stat().st_size == 10


def test_eviction_drops_least_recently_used_until_within_the_cap(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path / "cache", max_bytes=250, in_use_s=3600)
    root = cache.root
    for name, age in (("oldest", 9000), ("older", 8000), ("old", 7000)):
        _age(_build(root, name, 100), age)
    _age(_build(root, "triton-base", 1000), 99999)
    assert cache.evict() == ["oldest"]
    assert sorted(p.name for p in root.iterdir()) == ["old", "older", "triton-base"]
    assert not list(tmp_path.glob(".evicted-*"))


def test_eviction_spares_builds_used_within_the_in_use_window(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path / "cache", max_bytes=50, in_use_s=3600)
    _age(_build(cache.root, "idle", 100), 7200)
    _build(cache.root, "in_use", 100)  # used just now: a child may be loading it
    assert cache.evict() == ["idle"]
    assert [p.name for p in cache.root.iterdir()] == ["in_use"]


def test_publishing_keeps_the_cap(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path / "cache", max_bytes=150, in_use_s=0, check_every_s=0)
    cache.root.mkdir()
    cache.publish(_build(tmp_path / "w1", "a", 100), "first")
    _age(cache.path_for("first"), 100)
    cache.publish(_build(tmp_path / "w2", "b", 100), "second")
    assert cache.lookup("first") is None and cache.lookup("second") is not None
