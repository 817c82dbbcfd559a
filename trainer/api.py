"""The trainer service's HTTP app: runs of the alternating loop."""

from services.api.app import create_service_app
from trainer.routes import router

app = create_service_app("trainer", router, description="Runs of the alternating loop: submit, follow, cancel.")
