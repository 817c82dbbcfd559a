"""The proposer service's HTTP app."""

from services.api.app import create_service_app
from proposer_svc.routes import router

app = create_service_app("proposer", router, description="Task proposals from mined API co-occurrence, sandboxed validation, the frontier.")
