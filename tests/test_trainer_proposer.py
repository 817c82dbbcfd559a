"""Proposer RL: the Proposer's sampled groups (G replies to one API set's prompt, each kept as drawn,
with its tokens), their rewards (the frontier reward of the Coder's pass rate on a valid new module,
the penalty ρ otherwise), and the Proposer's half of a round end to end through the real services."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from coder_svc import kernel_messages, system_prompt_for
from proposer_svc import FrontierConfig, frontier_reward
from proposer_svc.compose.base import ProposalHints
from proposer_svc.compose.llm import build_messages
from proposer_svc.mining import directory_corpus, mine, save_stats
from proposer_svc.service import propose
from reward_cases import CORRECT, RELU_REFERENCE
from servers import serve
from services.clients import CoderClient, ProposerClient, TrainerClient
from services.config import Settings
from services.db.models import Job, RolloutGroup, Task
from services.db.session import session_scope
from services.db.tasks import ensure_task
from services.llm.chat import SampledTokens
from services.queue.names import PROPOSE_TASK
from services.schemas.proposer import ProposalOut, ProposeRequest, ProposeSummary, SampledReply
from trainer.config import LoopConfig
from trainer.intake import proposer_samples
from trainer.proposer_half import half_key, proposer_half
from trainer.publish import save_version
from trainer.records import RunRecorder, run_records
from trainer.rollouts import UNSCORED
from trainer.round_context import Quiet, Services, claim_key
from trainer.runs import create_run
from trainer.tiny_model import build_replying_lm, build_tiny_lm

TANH_MODULE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.tanh(x) * 2.0


batch_size = 16
dim = 64


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
"""
API_SET = ["torch.tanh"]
HINTS = ProposalHints()  # the loop's defaults: difficulty 0.5, max_ops 6
PENALTY = -0.5


def mine_tanh_corpus(root: Path) -> None:
    """Statistics in which torch.tanh is the only API used: with one API per set, every prompt asks for it."""
    root.mkdir()
    (root / "models.py").write_text(TANH_MODULE.replace("torch.tanh(x) * 2.0", "torch.tanh(x)"))
    sources = directory_corpus([root])
    save_stats("tanh", mine(sources), sources)


def proposer_lm(directory: Path) -> Path:
    """A tiny Proposer that answers the torch.tanh prompt with the module about 40% of the time."""
    return build_replying_lm(directory, build_messages(API_SET, HINTS), f"```python\n{TANH_MODULE}```")


def reply(text: str, prompt: str | None = None) -> SampledReply:
    return SampledReply(text=text, tokens=SampledTokens(prompt=prompt, completion_ids=[1, 2, 3], logprobs=[-0.1, -0.2, -0.3]))


def test_each_reply_earns_the_frontier_reward_of_its_module_or_the_penalty() -> None:
    def proposal(status: str, task_id: str | None = None, group: int = 0) -> ProposalOut:
        return ProposalOut(task_id=task_id, status=status, reason="", api_set=API_SET, group=group, reply=reply(status))  # type: ignore[arg-type]

    proposals = [
        proposal("valid", "half"),  # the Coder solves it half the time: the frontier's peak
        proposal("valid", "always"),  # always solved: no frontier reward
        proposal("valid", "quarter"),
        proposal("rejected", "bad"),  # stored, but not a valid task
        proposal("declined"),
        proposal("exists"),  # already in the pool: not new
        proposal("valid", "half", group=1),  # another group's
    ]
    summary = ProposeSummary.model_validate(
        {
            **dict.fromkeys(("requested", "valid", "rejected", "declined", "exists", "apis_covered", "pairs_covered"), 0),
            "reasons": {},
            "corpus": None,
            "seconds": 0.0,
            "proposals": [p.model_dump() for p in proposals],
            "prompts": [[{"role": "user", "content": "zero"}], [{"role": "user", "content": "one"}]],
        }
    )
    rates: dict[str, float | None] = {"half": 0.5, "always": 1.0, "quarter": 0.25}
    linear = FrontierConfig(shape="linear")
    samples = proposer_samples(
        summary, 0, lambda m: f"rendered {m[0]['content']}", rates, lambda p: frontier_reward(p, linear), PENALTY
    )
    assert [(s.status, s.reward) for s in samples] == [
        ("valid", 1.0),
        ("valid", 0.0),
        ("valid", 0.5),
        ("rejected", PENALTY),
        ("declined", PENALTY),
        ("exists", PENALTY),
    ]
    assert all(s.prompt == "rendered zero" and s.completion_ids == [1, 2, 3] for s in samples)
    assert samples[0].behaviour_logps == [-0.1, -0.2, -0.3]

    rates["half"] = None  # the Coder's candidates on it could not be judged: the group stays out of the loss
    again = proposer_samples(summary, 1, lambda m: "unused", rates, lambda p: frontier_reward(p, linear), PENALTY)
    assert [(s.status, s.reward) for s in again] == [(UNSCORED, None)]


def test_a_sampled_group_keeps_every_reply_with_its_tokens_and_repeats_share_one_task(
    platform_env: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = platform_env(
        coder_model_backend="hf",
        coder_hf_model_path=proposer_lm(tmp_path / "proposer-lm"),
        proposer_corpus="tanh",
        proposer_api_set_size=1,
        proposer_validation_warm_children=0,
    )
    mine_tanh_corpus(tmp_path / "corpus")
    request = ProposeRequest(count=1, backend="llm", group_size=8, device="cpu", seed=3, max_tokens=200)
    summary = propose(request, settings)

    assert len(summary.prompts) == 1 and API_SET[0] in summary.prompts[0][-1]["content"]
    assert len(summary.proposals) == 8 and {p.group for p in summary.proposals} == {0}
    for proposal in summary.proposals:
        tokens = proposal.reply.tokens if proposal.reply else None
        assert tokens is not None and tokens.prompt and len(tokens.completion_ids) == len(tokens.logprobs or []) > 0
    statuses = Counter(p.status for p in summary.proposals)
    assert statuses["valid"] >= 1 and statuses["declined"] >= 1, statuses  # the group carries a signal
    assert set(statuses) <= {"valid", "declined"}
    assert len({p.task_id for p in summary.proposals if p.status == "valid"}) == 1  # one module, one task, every copy
    with session_scope() as session:
        assert session.scalar(select(func.count()).select_from(Task)) == 1

    again = propose(request.model_copy(update={"seed": 4}), settings)  # the module is in the pool now: not new
    assert {p.status for p in again.proposals} <= {"exists", "declined"} and "exists" in {p.status for p in again.proposals}


@pytest.mark.parametrize("group_size", [1, 4])
def test_sampled_groups_need_the_llm_composer(platform_env: Callable[..., Settings], group_size: int) -> None:
    from proposer_svc.service import ComposerUnavailable, submit_propose

    platform_env(proposer_composer="composer")
    request = ProposeRequest(count=1, group_size=group_size, seed=1)
    if group_size == 1:
        assert submit_propose(request).id
    else:
        with pytest.raises(ComposerUnavailable, match="need the llm composer"):
            submit_propose(request)


@pytest.mark.slow  # five services' workers and APIs, two tiny models, sandboxed validation and verdicts
def test_a_round_trains_and_publishes_the_proposer_after_the_coder(
    coder_api: str,
    platform_env: Callable[..., Settings],
    start_worker: Callable[..., Any],
    free_port: Callable[[], int],
    tmp_path: Path,
) -> None:
    """One round of both halves through the real services: the Coder's (as in test_trainer_loop), then
    the Proposer's: its tiny model samples a group on the torch.tanh prompt (the module about 40% of the
    time), the Proposer service validates and stores the module, the frozen Coder's candidates on it
    set p, the Proposer trains a GRPO step and publishes proposer-v1, which the Proposer then serves."""
    messages = kernel_messages(RELU_REFERENCE, "triton", system_prompt_for("triton"))
    coder_model = build_replying_lm(tmp_path / "tiny-lm", messages, f"```python\n{CORRECT}\n```")
    proposer_model = proposer_lm(tmp_path / "proposer-lm")
    ensure_task(RELU_REFERENCE, "reference")
    proposer_port, trainer_port = free_port(), free_port()
    platform_env(
        proposer_port=proposer_port,
        trainer_port=trainer_port,
        proposer_corpus="tanh",
        proposer_api_set_size=1,
        coder_model_backend="hf",  # the kind of model the Proposer's llm composer runs (its version: the run's)
    )
    mine_tanh_corpus(tmp_path / "corpus")
    start_worker("proposer")
    start_worker("trainer")
    config = {
        "coder": {"model_path": str(coder_model), "group_size": 8, "groups_per_step": 1, "learning_rate": 5e-3, "bf16": False},
        "proposer": {
            "model_path": str(proposer_model),
            "group_size": 8,
            "groups_per_step": 1,
            "learning_rate": 5e-3,
            "coder_samples": 2,
            "max_completion_tokens": 200,
            "bf16": False,
        },
        "coder_steps": 1,
        "proposer_steps": 1,
        "model_backend": "hf",
        "device": "cpu",
        "max_tokens": 8,
        "scoring_timeout_s": 120,
    }
    with serve("proposer_svc.api:app", proposer_port), serve("trainer.api:app", trainer_port), TrainerClient() as trainer:
        run = trainer.submit_run(config)
        deadline = time.monotonic() + 600
        while run.status in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(1)
            run = trainer.run(run.id)
        assert run.status == "succeeded", run.error
        with ProposerClient() as proposer:
            serving = proposer.serving_model()
            after = proposer.propose(ProposeRequest(count=1, backend="llm", device="cpu", seed=11, max_tokens=200), wait_s=300)

    assert run.rounds_done == 1 and run.coder_version_id and run.proposer_version_id
    halves = {(r.kind, r.role): r.metrics for r in run.records}
    assert set(halves) == {("round", "coder"), ("step", "coder"), ("round", "proposer"), ("step", "proposer")}
    proposer_round = halves["round", "proposer"]
    assert proposer_round["groups"] == 1 and proposer_round["samples"] == 8
    assert 0 < proposer_round["valid_fraction"] < 1 and proposer_round["modules_measured"] == 1
    assert proposer_round["sampled_with"] == "proposer-lm" and proposer_round["published"] == "proposer-v1"
    assert halves["step", "proposer"]["samples"] == 8 and halves["step", "proposer"]["tokens"] > 0
    with session_scope() as session:
        groups = session.scalars(select(RolloutGroup).where(RolloutGroup.role == "proposer")).all()
        assert [(g.claimed_by, g.dropped) for g in groups] == [(f"{run.id}/r0/proposer", None)]
        new_tasks = session.scalars(select(Task).where(Task.origin.like("llm:%"))).all()
        assert len(new_tasks) == 1 and "torch.tanh" in (new_tasks[0].api_set or [])
    assert (serving.name, serving.id) == ("proposer-v1", run.proposer_version_id)
    assert after.result is not None and after.job_status == "succeeded"
    assert after.result.proposals[0].status in ("exists", "declined")  # its module again, or no module: nothing new


@pytest.mark.slow  # a proposer API process
def test_a_proposer_half_whose_worker_died_after_publishing_stands(
    platform_env: Callable[..., Settings], free_port: Callable[[], int], tmp_path: Path
) -> None:
    """The half is delivered again after its worker published proposer-v1 and died before the run
    recorded it: it finds that version (its origin file), serves it again and records the half as
    recovered, sampling nothing and training nothing."""
    model = build_tiny_lm(tmp_path / "tiny")
    port = free_port()
    platform_env(auth_enabled="false", proposer_port=port, coder_model_backend="hf")
    config = LoopConfig.model_validate(
        {"coder": {"model_path": str(model)}, "proposer": {"model_path": str(model)}, "coder_steps": 1, "proposer_steps": 1}
    )
    run_id = create_run(config, tmp_path / "run")
    key = claim_key(run_id, 0)
    store = tmp_path / "models"
    published = save_version(lambda d: d.mkdir(parents=True), store, "proposer", origin=half_key(key))
    with serve("proposer_svc.api:app", port), ProposerClient() as proposer, CoderClient() as coder:
        outcome = proposer_half(
            config, key, 0, None, Services(proposer, coder), store, RunRecorder(run_id, tmp_path / "run"), Quiet(), lambda: False
        )
        serving = proposer.serving_model()
    assert outcome.path == published and outcome.published is not None
    assert outcome.published.name == serving.name == "proposer-v1" and serving.adapter_path == str(published)
    assert [(r.kind, r.role, r.metrics.get("recovered")) for r in run_records(run_id)] == [("round", "proposer", True)]
    with session_scope() as session:
        assert session.scalar(select(func.count()).select_from(Job).where(Job.kind == PROPOSE_TASK)) == 0
