"""The reward service's HTTP app."""

from reward_svc.routes import router
from services.api.app import create_service_app

app = create_service_app(
    "reward", router, description="Sandboxed compile, verify and benchmark of untrusted GPU kernels; CA-GRPO rewards."
)
