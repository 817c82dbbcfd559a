"""The proposer service's HTTP app."""

from proposer_svc.routes import router
from services.api.app import create_service_app

app = create_service_app(
    "proposer", router, description="Task proposals from mined API co-occurrence, sandboxed validation, the frontier."
)
