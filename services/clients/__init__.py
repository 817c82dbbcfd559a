"""Typed HTTP clients (the Python SDK) of the four services, for other services, CI plugins and RL
pipelines: each blocking (``RewardClient``) and for asyncio (``AsyncRewardClient``), from one definition
of each route (``base.py`` says how)."""

from services.clients.base import (
    AsyncServiceClient,
    JobTimeout,
    RetryPolicy,
    ServiceClient,
    ServiceError,
    ServiceUnreachable,
)
from services.clients.coder import AsyncCoderClient, CoderClient
from services.clients.proposer import AsyncProposerClient, ProposerClient
from services.clients.reward import AsyncRewardClient, RewardClient
from services.clients.trainer import AsyncTrainerClient, TrainerClient

__all__ = [
    "AsyncCoderClient",
    "AsyncProposerClient",
    "AsyncRewardClient",
    "AsyncServiceClient",
    "AsyncTrainerClient",
    "CoderClient",
    "JobTimeout",
    "ProposerClient",
    "RetryPolicy",
    "RewardClient",
    "ServiceClient",
    "ServiceError",
    "ServiceUnreachable",
    "TrainerClient",
]
