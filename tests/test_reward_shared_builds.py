"""What the reward harness's children share, built by a child that runs only our code
(reward_svc/shared_builds.py): the precompiled headers, published read-only, offered to the children
started after, and used by their load_inline builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_cases import CUDA_RELU
from reward_cases import RELU_REFERENCE
from reward_svc import compile as kzc
from reward_svc.evaluate import REPORTED_BUILDS, Evaluator, reported_builds
from reward_svc.nvcc_phases import PREFIX_HEADER
from reward_svc.shared_builds import SharedBuilds, torch_and_python
from services.config import Settings
from services.schemas.reward import ScoreOptions


@pytest.mark.slow  # a child precompiles torch's headers (seconds of CPU each)
def test_the_precompiled_headers_are_built_in_a_child_published_and_used_by_later_builds(tmp_path: Path) -> None:
    evaluator = Evaluator(Settings(data_dir=tmp_path, reward_warm_children=1, reward_parallel_children=2))
    try:
        pool = evaluator.pool("cpu")
        shared = pool.extras
        assert isinstance(shared, SharedBuilds) and not shared.precompiled_headers.exists()  # on a GPU, prime starts it
        assert shared.precompiled_headers.name == f"precompiled-headers-{torch_and_python()}"
        (shared.precompiled_headers.parent / "precompiled-headers-0ld70rch").mkdir(parents=True)  # an upgrade ago
        assert shared.remove_other_torches_headers() == ["precompiled-headers-0ld70rch"]
        assert shared.build_precompiled_headers(pool)
        built = sorted(shared.precompiled_headers.glob(f"bindings-*/{kzc.PCH_HEADER}.gch"))
        assert len(built) == len(kzc.BINDINGS_PCH_VARIANTS)
        hosts = sorted(shared.precompiled_headers.glob(f"cuda-host-*/{PREFIX_HEADER}.gch"))
        assert len(hosts) == len(kzc.HOST_PREFIX_VARIANTS)
        assert shared.env(tmp_path)[kzc.PRECOMPILED_HEADERS_ENV] == str(shared.precompiled_headers)
        assert shared.precompiled_headers in shared.readonly_dirs()

        pool.take().discard()  # the warm child started before the headers were published: later ones see them
        options = ScoreOptions(backend="cuda", device="cpu", timeout_s=300)
        (verdict,) = evaluator.evaluate_group(RELU_REFERENCE, [CUDA_RELU], options).verdicts
        assert verdict.status == "unverified", verdict.reason  # compiled; running it needs a GPU
        (build,) = verdict.details["builds"]
        assert build["ok"] and build["strategy"].startswith("cpp:lean+pch(") and " cu:lean+pch(" in build["strategy"], build
    finally:
        evaluator.close()


def test_a_childs_account_of_its_builds_reaches_the_verdict_trimmed() -> None:
    """The child reports its builds (its own process could rewrite the log): plain fields, the first few."""
    honest = {"name": "relu_ext", "strategy": "cpp:lean+pch(3.4s) cu:lean(7.2s) parallel", "seconds": 7.3, "ok": True}
    padded = {**honest, "cache_hit": False, "stderr_tail": "...", "content_hash": "ab", "extra": {"nested": [1] * 1000}}
    assert reported_builds([padded, "not a build", {"strategy": "x" * 10_000, "seconds": float("nan")}]) == [
        {**honest, "cache_hit": False},
        {},
    ]
    assert len(reported_builds([honest] * 1000)) == REPORTED_BUILDS and reported_builds({"a": 1}) == []
