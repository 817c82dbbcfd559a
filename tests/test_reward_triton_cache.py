"""The children's Triton cache: published read-only layers first, then the child's own directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reward_svc.harness import triton_cache


@pytest.fixture
def layered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    base, published, private = tmp_path / "triton-base", tmp_path / "cache-sha" / "triton", tmp_path / "own"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(private))
    monkeypatch.setenv(triton_cache.LAYERS_ENV, f"{published}:{base}")
    return base, published, private


def test_lookups_prefer_layers_in_order_and_writes_stay_private(layered: tuple[Path, Path, Path]) -> None:
    base, published, private = layered
    for layer, text in ((base, "base"), (published, "published")):
        (layer / "KEY").mkdir(parents=True)
        (layer / "KEY" / "stub.so").write_text(text)
    (base / "KEY" / "only_base.so").write_text("b")
    manager = triton_cache.LayeredCacheManager("KEY")
    assert Path(manager.get_file("stub.so")).read_text() == "published"
    assert Path(manager.get_file("only_base.so")).read_text() == "b"
    assert manager.get_file("missing.so") is None
    written = manager.put(b"new", "kernel.cubin")
    assert Path(written).is_relative_to(private) and manager.get_file("kernel.cubin") == written


def test_a_moved_layer_still_resolves_its_groups(layered: tuple[Path, Path, Path]) -> None:
    """Triton writes absolute member paths; a published layer has been renamed since."""
    _, published, _ = layered
    (published / "KEY").mkdir(parents=True)
    (published / "KEY" / "k.cubin").write_bytes(b"\x7fELF")
    group = {"child_paths": {"k.cubin": "/old/workdir/build/triton/KEY/k.cubin"}}
    (published / "KEY" / "__grp__k.json").write_text(json.dumps(group))
    members = triton_cache.LayeredCacheManager("KEY").get_group("k.json")
    assert members == {"k.cubin": str(published / "KEY" / "k.cubin")}


def test_a_group_with_a_missing_member_is_a_miss(layered: tuple[Path, Path, Path]) -> None:
    _, published, _ = layered
    (published / "KEY").mkdir(parents=True)
    (published / "KEY" / "__grp__k.json").write_text(json.dumps({"child_paths": {"k.cubin": "/x/k.cubin"}}))
    assert triton_cache.LayeredCacheManager("KEY").get_group("k.json") is None
