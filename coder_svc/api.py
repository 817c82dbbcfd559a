"""The coder service's HTTP app (its domain routes arrive with its own issue)."""

from services.api.app import create_service_app

app = create_service_app("coder")
