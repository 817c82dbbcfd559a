"""The coder service's HTTP app."""

from coder_svc.routes import router
from coder_svc.service import CODER_ROLE
from services.api.app import create_service_app
from services.api.routes_serving import serving_router

app = create_service_app(
    "coder",
    router,
    serving_router(CODER_ROLE),
    description="Best-of-n verified CUDA/Triton kernels from model backends; serving-model switch.",
)
