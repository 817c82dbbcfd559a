"""The admin routes of a service that serves a model version (the Coder; the Proposer's llm composer):
read what serves, and switch it with an admin key. The role's workers apply a switch at their next
job (a Coder generation, a Proposer round), no restart."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from services.api.errors import error_answers
from services.api.strict_json import StrictJSONRoute
from services.auth import require_admin_key, require_api_key
from services.config import get_settings
from services.db.serving import Role, serving_model, switch_model
from services.llm.factory import configured_model
from services.schemas.serving import ModelSwitch, ServingModel


def serving_router(role: Role) -> APIRouter:
    router = APIRouter(tags=["serving"], dependencies=[Depends(require_api_key)], route_class=StrictJSONRoute)

    @router.get("/admin/model", response_model=ServingModel)
    def read_serving_model() -> ServingModel:
        """The version the role serves, else the configured model (``KZ_CODER_MODEL_BACKEND`` and its settings)."""
        return serving_model(role, configured_model(get_settings()))

    @router.post(
        "/admin/model",
        response_model=ServingModel,
        dependencies=[Depends(require_admin_key)],
        responses=error_answers(403),
    )
    def switch_serving_model(switch: ModelSwitch) -> ServingModel:
        """Serve this model or LoRA adapter from the role's next job on (admin key); recorded once per version."""
        return switch_model(role, switch, get_settings().coder_model_backend)

    return router
