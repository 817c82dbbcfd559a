"""The proposer service's HTTP app."""

from proposer_svc.composer_model import PROPOSER_ROLE
from proposer_svc.routes import router
from services.api.app import create_service_app
from services.api.routes_serving import serving_router

app = create_service_app(
    "proposer",
    router,
    serving_router(PROPOSER_ROLE),
    description="Task proposals from mined API co-occurrence, sandboxed validation, the frontier; the llm composer's model.",
)
