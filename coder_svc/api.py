"""The coder service's HTTP app."""

from coder_svc.routes import router
from services.api.app import create_service_app

app = create_service_app(
    "coder", router, description="Best-of-n verified CUDA/Triton kernels from model backends; serving-model switch."
)
