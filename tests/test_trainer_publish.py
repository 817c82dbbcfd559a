"""Weight publishing: a trained Coder is saved whole as the next version and served through the Coder
service, so jobs generated afterwards carry the new version; an adapter or full weights alike."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from reward_cases import RELU_REFERENCE
from services.clients import CoderClient
from services.db.models import ModelVersion
from services.db.session import session_scope
from services.schemas.coder import KernelRequest
from trainer.config import CoderRLConfig
from trainer.publish import next_version_name, publish_version, save_version
from trainer.tiny_model import build_tiny_lm


def _crashing(directory: Path) -> None:
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text("{}")
    raise OSError("No space left on device")


def _saving(directory: Path) -> None:
    directory.mkdir(parents=True)
    (directory / "adapter_model.safetensors").write_bytes(b"weights")


def test_versions_are_numbered_and_a_failed_save_leaves_none(tmp_path: Path) -> None:
    store = tmp_path / "models"
    assert next_version_name(store, "coder") == "coder-v1"
    with pytest.raises(OSError, match="No space left"):
        save_version(_crashing, store, "coder")
    assert list(store.iterdir()) == []  # nothing a worker could load half of, no staging left behind
    assert save_version(_saving, store, "coder").name == "coder-v1"
    (store / "proposer-v7").mkdir()
    assert save_version(_saving, store, "coder").name == "coder-v2"
    assert next_version_name(store, "proposer") == "proposer-v8"
    assert sorted(p.name for p in store.iterdir()) == ["coder-v1", "coder-v2", "proposer-v7"]


def test_a_publisher_that_took_the_next_number_meanwhile_is_not_overwritten(tmp_path: Path) -> None:
    store = tmp_path / "models"

    def slow_write(directory: Path) -> None:  # another run publishes while this one writes
        _saving(directory)
        save_version(_saving, store, "coder")

    assert save_version(slow_write, store, "coder").name == "coder-v2"
    assert sorted(p.name for p in store.iterdir()) == ["coder-v1", "coder-v2"]
    assert all((store / name / "adapter_model.safetensors").is_file() for name in ("coder-v1", "coder-v2"))


@pytest.mark.slow  # a coder and a reward service with their workers, a tiny model
def test_a_published_version_serves_the_next_job(coder_api: str, tmp_path: Path) -> None:
    from trainer.policy import PolicyTrainer

    model_dir = build_tiny_lm(tmp_path / "tiny-lm")
    store = tmp_path / "models"
    request = KernelRequest.model_validate(
        {
            "module": RELU_REFERENCE,
            "n": 1,
            "wait_s": 120,
            "model_backend": "hf",
            "sampling": {"max_tokens": 8, "seed": 0},
            "scoring": {"device": "cpu"},
        }
    )
    with CoderClient(base_url=coder_api) as client:
        adapter = PolicyTrainer(CoderRLConfig(model_path=model_dir, bf16=False))
        published = publish_version("coder", adapter.save, store, client.switch_model, base_model=model_dir, adapter=True)
        assert published.name == "coder-v1" and published.adapter_path == str(store / "coder-v1")
        assert (store / "coder-v1" / "adapter_config.json").is_file()
        response = client.generate(request)
        assert response.result is not None, response
        assert response.result.model_version_id == published.id
        assert response.result.candidates[0].model == "coder-v1"

        full = PolicyTrainer(CoderRLConfig(model_path=model_dir, lora=None, bf16=False))
        again = publish_version("coder", full.save, store, client.switch_model, base_model=model_dir, adapter=False)
        assert again.name == "coder-v2" and again.base_model == str(store / "coder-v2") and again.adapter_path is None
        assert (store / "coder-v2" / "config.json").is_file()
        response = client.generate(request.model_copy(update={"sampling": request.sampling.model_copy(update={"seed": 1})}))
        assert response.result is not None and response.result.model_version_id == again.id, response
        assert response.result.candidates[0].model == "coder-v2"  # the worker loaded the new weights as its model
    with session_scope() as session:
        versions = session.scalars(select(ModelVersion).where(ModelVersion.role == "coder").order_by(ModelVersion.created_at))
        assert [(v.name, v.serving) for v in versions] == [("coder-v1", False), ("coder-v2", True)]
