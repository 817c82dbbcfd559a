"""The reward service's HTTP app."""

from services.api.app import create_service_app

app = create_service_app("reward")
