"""Client of the reward service (the scoring methods arrive with the reward service's routes)."""

from services.clients.base import ServiceClient


class RewardClient(ServiceClient):
    service = "reward"
