"""Client of the trainer service (rollout and training routes arrive with its issue)."""

from services.clients.base import ServiceClient


class TrainerClient(ServiceClient):
    service = "trainer"
