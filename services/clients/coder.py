"""Client of the coder service (kernel generation routes arrive with its issue)."""

from services.clients.base import ServiceClient


class CoderClient(ServiceClient):
    service = "coder"
