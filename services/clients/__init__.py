"""Typed HTTP clients for the four services, for other services, CI plugins and RL pipelines."""

from services.clients.base import JobTimeout, ServiceClient, ServiceError, ServiceUnreachable
from services.clients.coder import CoderClient
from services.clients.proposer import ProposerClient
from services.clients.reward import RewardClient
from services.clients.trainer import TrainerClient

__all__ = [
    "CoderClient",
    "JobTimeout",
    "ProposerClient",
    "RewardClient",
    "ServiceClient",
    "ServiceError",
    "ServiceUnreachable",
    "TrainerClient",
]
