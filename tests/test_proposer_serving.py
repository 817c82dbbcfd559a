"""The Proposer serves its own model versions, as the Coder does: its ``/v1/admin/model`` records and
reads back role ``proposer``'s version apart from the Coder's, and the llm composer built after a
switch writes with that version (a tiny local model with a LoRA adapter; a scripted OpenAI-compatible
endpoint loading adapters at runtime). Versions on SQLite and PostgreSQL, real Redis, servers in threads."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from sqlalchemy import select

from proposer_svc.compose.base import ProposalHints
from proposer_svc.service import ComposerUnavailable, build_composer
from servers import serving
from services import auth
from services.clients import CoderClient, ProposerClient
from services.config import Settings
from services.db import migrate
from services.db.models import ModelVersion
from services.db.serving import switch_model
from services.db.session import session_scope
from services.llm.chat import Sampling
from services.llm.hf_local import HFChatModel
from services.schemas.serving import ModelSwitch
from test_proposer_compose import LLM_REPLY
from tiny_lm import build_lora
from trainer.tiny_model import build_tiny_lm

MESSAGES = [{"role": "user", "content": "Write a task."}]
API_SET = ["torch.nn.Linear", "torch.nn.functional.gelu", "torch.logsumexp"]


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, platform_env: Callable[..., Settings]) -> Callable[..., Settings]:
    """``platform_env`` on SQLite, or on the session's PostgreSQL database (shared: other tests' rows are there too)."""
    if request.param == "postgres":
        platform_env(database_url=request.getfixturevalue("postgres_url"))
        migrate.upgrade()
    return platform_env


def versions(role: str, names: tuple[str, ...]) -> list[tuple[str, bool]]:
    """The recorded versions of ``role`` by these names, oldest first, and whether each serves."""
    with session_scope() as session:
        query = select(ModelVersion).where(ModelVersion.role == role, ModelVersion.name.in_(names))
        return [(row.name, row.serving) for row in session.scalars(query.order_by(ModelVersion.created_at))]


def serving_names(role: str) -> list[str]:
    with session_scope() as session:
        return list(session.scalars(select(ModelVersion.name).where(ModelVersion.role == role, ModelVersion.serving.is_(True))))


def test_proposer_and_coder_switch_their_own_versions(database: Callable[..., Settings]) -> None:
    database(auth_enabled="false", coder_model_backend="hf", coder_hf_model_path="/models/base")
    from coder_svc.api import app as coder_app  # imported here: the first app built in a process owns /metrics' counters
    from proposer_svc.api import app as proposer_app

    with serving(proposer_app) as proposer_url, serving(coder_app) as coder_url:
        proposer = ProposerClient(base_url=proposer_url.removesuffix("/v1"))
        coder = CoderClient(base_url=coder_url.removesuffix("/v1"))
        configured = proposer.serving_model()  # no switch yet: the Coder's configured model, as the composer used
        assert configured.id is None and configured.name == "/models/base" and configured.backend == "hf"

        v1 = proposer.switch_model(ModelSwitch(name="proposer-v1", adapter_path="/store/proposer-v1"))
        v2 = proposer.switch_model(ModelSwitch(name="proposer-v2", adapter_path="/store/proposer-v2"))
        assert v1.id is not None and v2.id not in (None, v1.id) and proposer.serving_model().id == v2.id
        back = proposer.switch_model(ModelSwitch(name="proposer-v1", adapter_path="/store/proposer-v1"))
        assert back.id == v1.id and back.name == "proposer-v1"  # recorded once: switching back keeps its record and id
        assert coder.serving_model().id is None  # the Coder still serves its configured model

        coder_v1 = coder.switch_model(ModelSwitch(name="coder-v1", adapter_path="/store/coder-v1"))
        assert coder.serving_model().id == coder_v1.id and proposer.serving_model().id == v1.id

        for body, word in [({"adapter_path": "/x"}, "name"), ({"name": ""}, "at least 1 character")]:
            refused = httpx.post(f"{proposer_url}/admin/model", json=body, timeout=10)
            assert refused.status_code == 422 and word in refused.text, refused.text
        proposer.close()
        coder.close()
    assert versions("proposer", ("proposer-v1", "proposer-v2")) == [("proposer-v1", True), ("proposer-v2", False)]
    assert serving_names("proposer") == ["proposer-v1"] and serving_names("coder") == ["coder-v1"]


def test_switching_the_proposers_model_needs_an_admin_key(platform_env: Callable[..., Settings]) -> None:
    platform_env(auth_enabled=True)
    from proposer_svc.api import app as proposer_app

    _, plain = auth.create_api_key("ci")
    _, admin = auth.create_api_key("operator", admin=True)
    client = TestClient(proposer_app)
    switch = {"name": "proposer-v1", "adapter_path": "/store/proposer-v1"}
    assert client.get("/v1/admin/model", headers={"X-API-Key": plain}).status_code == 200  # reading is for every key
    assert client.get("/v1/admin/model").status_code == 401
    refused = client.post("/v1/admin/model", json=switch, headers={"X-API-Key": plain})
    assert refused.status_code == 403 and "admin API key" in refused.json()["detail"]
    assert client.post("/v1/admin/model", json=switch, headers={"X-API-Key": "kz_unknown"}).status_code == 401
    accepted = client.post("/v1/admin/model", json=switch, headers={"X-API-Key": admin})
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["name"] == "proposer-v1" and serving_names("proposer") == ["proposer-v1"]


def test_the_llm_composer_serves_the_proposers_local_version(platform_env: Callable[..., Settings], tmp_path: Path) -> None:
    model_dir = build_tiny_lm(tmp_path / "tiny-lm")
    adapter = build_lora(model_dir, tmp_path / "store" / "proposer-v1", seed=1)
    settings = platform_env(coder_model_backend="hf", coder_hf_model_path=model_dir)
    configured = build_composer("llm", settings).model
    assert isinstance(configured, HFChatModel) and configured.active_adapter is None
    assert build_composer("llm", settings).model is configured  # kept across rounds, not loaded again

    switch_model("proposer", ModelSwitch(name="proposer-v1", base_model=str(model_dir), adapter_path=str(adapter)), "hf")
    served = build_composer("llm", settings).model
    assert isinstance(served, HFChatModel) and served is not configured
    assert served.model_path == model_dir and served.describe()["adapter"] == "proposer-v1"
    reply = served.complete(MESSAGES, Sampling(n=1, max_tokens=4, seed=0))[0]
    assert reply.model == "proposer-v1" and "+proposer-v1@" in (reply.model_version or "")  # what origin and details record
    assert build_composer("llm", settings).model is served

    whole = tmp_path / "store" / "proposer-v2"  # a version of whole weights, served under its own name
    build_tiny_lm(whole, seed=2)
    switch_model("proposer", ModelSwitch(name="proposer-v2", base_model=str(whole)), "hf")
    weights = build_composer("llm", settings).model
    assert isinstance(weights, HFChatModel) and weights.model_path == whole and weights.active_adapter is None
    assert weights.complete(MESSAGES, Sampling(n=1, max_tokens=4, seed=0))[0].model == "proposer-v2"


class Endpoint:
    """An OpenAI-compatible endpoint like vLLM with runtime LoRA updating: it answers every chat with
    one module, naming the model the request asked for, and keeps the adapters loaded on it."""

    def __init__(self) -> None:
        self.adapters: dict[str, str] = {}
        self.asked: list[str] = []

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            listed = [{"id": "base", "root": "/models/base", "parent": None}]
            listed += [{"id": name, "root": path, "parent": "base"} for name, path in self.adapters.items()]
            return {"object": "list", "data": listed}

        @app.post("/v1/load_lora_adapter")
        async def load(request: Request) -> str:
            body = await request.json()
            self.adapters[body["lora_name"]] = body["lora_path"]
            return "loaded"

        @app.post("/v1/unload_lora_adapter")
        async def unload(request: Request) -> str:
            del self.adapters[(await request.json())["lora_name"]]
            return "unloaded"

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> dict[str, Any]:
            model = (await request.json())["model"]
            self.asked.append(model)
            choice = {"index": 0, "message": {"role": "assistant", "content": LLM_REPLY}, "finish_reason": "stop"}
            return {"id": "x", "object": "chat.completion", "created": 0, "model": model, "choices": [choice]}

        return app


def test_the_llm_composer_loads_the_proposers_adapter_on_the_endpoint(platform_env: Callable[..., Settings]) -> None:
    endpoint = Endpoint()
    with serving(endpoint.app()) as url:
        settings = platform_env(coder_model_backend="openai", coder_openai_base_url=url, coder_adapters_kept=1)
        assert build_composer("llm", settings).compose(API_SET, ProposalHints(seed=0)).origin == "llm:base"

        switch_model("proposer", ModelSwitch(name="proposer-v1", adapter_path="/store/proposer-v1"), "openai")
        first = build_composer("llm", settings)
        module = first.compose(API_SET, ProposalHints(seed=0))
        assert module.origin == "llm:proposer-v1" and endpoint.asked[-1] == "proposer-v1"
        assert module.details["model_version"] == "base+proposer-v1@/store/proposer-v1"

        switch_model("proposer", ModelSwitch(name="proposer-v2", adapter_path="/store/proposer-v2"), "openai")
        second = build_composer("llm", settings)
        assert second.model is first.model  # the same endpoint: only the adapter switched
        assert second.compose(API_SET, ProposalHints(seed=0)).origin == "llm:proposer-v2"
        assert endpoint.adapters == {"proposer-v2": "/store/proposer-v2"}  # KZ_CODER_ADAPTERS_KEPT=1 unloaded v1


def test_without_a_model_the_llm_composer_is_refused_even_with_a_version(platform_env: Callable[..., Settings]) -> None:
    settings = platform_env(coder_model_backend="template")
    switch_model("proposer", ModelSwitch(name="proposer-v1", adapter_path="/store/proposer-v1"), "template")
    with pytest.raises(ComposerUnavailable, match="needs a model"):
        build_composer("llm", settings)


def test_a_proposal_asked_again_after_a_switch_is_a_new_job(platform_env: Callable[..., Settings]) -> None:
    """The llm composer's serving version is part of a proposal job's input, as the Coder's is of its
    jobs: the same request under the same version is the same job, after a switch a new one."""
    from proposer_svc.service import submit_propose
    from services.schemas.proposer import ProposeRequest

    platform_env(coder_model_backend="hf", coder_hf_model_path="/models/base")
    request = ProposeRequest(count=2, backend="llm", group_size=4, seed=7)
    first = submit_propose(request)
    assert submit_propose(request).id == first.id
    switch_model("proposer", ModelSwitch(name="proposer-v1", base_model="/models/base", adapter_path="/store/proposer-v1"), "hf")
    after = submit_propose(request)
    assert after.id != first.id and after.payload["serving_version"] is not None
