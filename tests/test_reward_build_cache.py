"""The published-build cache: lookup marks use, publishing keeps the first build, eviction is LRU
within the cap and never touches a build in use or Triton's base layer."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from reward_svc.build_cache import BuildCache, publish_dir


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


SHM = Path("/dev/shm")


@pytest.mark.skipif(
    not SHM.is_dir() or SHM.stat().st_dev == Path(tempfile.gettempdir()).stat().st_dev,
    reason="needs /dev/shm on another filesystem than the temp dir",
)
def test_a_build_from_a_tmpfs_scratch_dir_is_published_to_a_cache_on_disk(tmp_path: Path) -> None:
    """GPU workers keep children's dirs on a tmpfs (KZ_REWARD_SCRATCH_DIR) and the cache on disk: a
    rename across them fails (EXDEV), which left every build, and Triton's base layer, unpublished."""
    cache = BuildCache(tmp_path / "cache", max_bytes=10_000)
    cache.root.mkdir()
    with tempfile.TemporaryDirectory(dir=SHM) as scratch:
        build = _build(Path(scratch), "build", 10)
        (build / "triton").mkdir()
        (build / "triton" / "kernel.cubin").write_bytes(b"cubin")
        cache.publish(build, "src")
        found = cache.lookup("src")
        assert found is not None and (found / "triton" / "kernel.cubin").read_bytes() == b"cubin"
        assert not list(cache.root.parent.glob(".publishing-*"))  # no staging copy left behind
        second = _build(Path(scratch), "again", 20)
        assert not publish_dir(second, cache.path_for("src"))  # the first build stays
        assert (found / "lib.so").read_bytes() == b"x" * 10
