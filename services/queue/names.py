"""Queue and task names shared by every service (tasks are sent by name across services)."""

from __future__ import annotations

PROPOSAL = "proposal"
GENERATION = "generation"
TRAINING = "training"
SCORE_CPU = "score.cpu"

# Task names: a job is sent by name, so the sender (any service, the trainer) needs no import of the worker.
PROPOSE_TASK = "proposer.propose"
GENERATE_TASK = "coder.generate"
SCORE_GROUP_TASK = "reward.score_group"
TRAIN_ROUND_TASK = "trainer.round"


def scoring_queue(device: int | None) -> str:
    """GPU timing is exclusive per device: one queue, consumed by one worker, per GPU."""
    return SCORE_CPU if device is None else f"score.gpu{device}"


def scoring_queues(gpu_devices: list[int]) -> list[str]:
    return [scoring_queue(d) for d in gpu_devices] or [SCORE_CPU]


def service_queues(service: str, gpu_devices: list[int]) -> list[str]:
    """The queues each service's worker consumes."""
    return {
        "proposer": [PROPOSAL],
        "coder": [GENERATION],
        "reward": scoring_queues(gpu_devices),
        "trainer": [TRAINING],
    }[service]


def probe_task_name(service: str) -> str:
    return f"{service}.probe"
