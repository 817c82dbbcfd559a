"""Client of the proposer service (task composition and validation routes arrive with its issue)."""

from services.clients.base import ServiceClient


class ProposerClient(ServiceClient):
    service = "proposer"
