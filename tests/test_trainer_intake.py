"""Rollout intake from the Coder: a generation sampled for training carries the prompt text, the reply's
token ids and the sampler's log-probabilities (the hf backend, and the openai backend over real HTTP
from a server that speaks vLLM's token-id logprobs), the log-probabilities are the ones the trainer
computes on the same weights (so the importance weight of an on-policy sample is 1), and a job's
result becomes one rollout group, once, each candidate counted by its verdict."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from sqlalchemy import select
from transformers import AutoModelForCausalLM

from coder_svc.best_of_n import LocalScorer, best_of_n
from coder_svc.generators import LLMKernelGenerator
from reward_svc.evaluate import Evaluator
from servers import serving
from services.config import Settings
from services.db import migrate
from services.db.models import Rollout
from services.db.session import session_scope
from services.llm.chat import Completion, Sampling
from services.llm.hf_local import HFChatModel
from services.llm.openai_chat import OpenAIChatModel
from services.llm.openai_server import create_openai_app
from services.schemas.coder import CandidateReport, KernelResult
from services.schemas.reward import CAGRPOConfig, ScoredVerdict, ScoreOptions
from trainer.intake import NO_CODE, coder_samples, record_coder_job
from trainer.loss import completion_logps, fuse_logps_head
from trainer.rollouts import UNSCORED
from trainer.tiny_model import build_tiny_lm

MESSAGES = [{"role": "system", "content": "You write GPU kernels."}, {"role": "user", "content": "Write a ReLU kernel."}]
RELU = (
    "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n\n\n"
    "def get_inputs():\n    return [torch.randn(64)]\n\n\ndef get_init_inputs():\n    return []\n"
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny-lm") / "tiny")


@pytest.fixture(scope="module")
def hf(tiny: Path) -> HFChatModel:
    return HFChatModel(tiny)


def trainer_logps(model: HFChatModel, completion: Completion, temperature: float) -> torch.Tensor:
    """The log-probabilities the trainer computes, on its own copy of the sampler's weights."""
    assert completion.tokens is not None and completion.tokens.prompt is not None
    prompt = model.tokenizer(completion.tokens.prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    ids = torch.tensor([completion.tokens.completion_ids])
    policy = fuse_logps_head(AutoModelForCausalLM.from_pretrained(model.model_path), temperature)
    with torch.no_grad():
        return completion_logps(policy, prompt, torch.ones_like(prompt), ids, torch.ones_like(ids))[0]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_hf_sampler_reports_the_log_probabilities_the_trainer_computes(hf: HFChatModel, temperature: float) -> None:
    completions = hf.complete(MESSAGES, Sampling(n=3, temperature=temperature, top_p=0.9, max_tokens=12, seed=3, logprobs=True))
    for completion in completions:
        tokens = completion.tokens
        assert tokens is not None and tokens.logprobs is not None
        assert tokens.prompt == hf.render(MESSAGES)
        assert len(tokens.logprobs) == len(tokens.completion_ids) > 0
        ids = tokens.completion_ids
        body = ids[:-1] if ids[-1] == hf.tokenizer.eos_token_id else ids  # the end token is sampled, not shown
        assert hf.tokenizer.decode(body, skip_special_tokens=True) == completion.text
        torch.testing.assert_close(
            trainer_logps(hf, completion, temperature), torch.tensor(tokens.logprobs), atol=1e-4, rtol=1e-4
        )
    assert all(c.tokens is None for c in hf.complete(MESSAGES, Sampling(n=1, max_tokens=4, seed=3)))


def test_the_openai_backend_reads_vllm_token_ids_and_log_probabilities_over_http(hf: HFChatModel, tiny: Path) -> None:
    sampling = Sampling(n=2, temperature=1.0, top_p=1.0, max_tokens=10, seed=11, logprobs=True)
    direct = hf.complete(MESSAGES, sampling)
    with serving(create_openai_app(HFChatModel(tiny))) as url:
        client = OpenAIChatModel(url)
        remote = client.complete(MESSAGES, sampling)
        plain = client.complete(MESSAGES, Sampling(n=1, max_tokens=4, seed=1))
    assert [c.text for c in remote] == [c.text for c in direct]
    for here, there in zip(direct, remote):
        assert there.tokens is not None and here.tokens is not None
        assert there.tokens.prompt is None  # the chat API does not show the rendered prompt: the trainer renders it
        assert there.tokens.completion_ids == here.tokens.completion_ids
        assert there.tokens.logprobs == pytest.approx(here.tokens.logprobs, abs=1e-6)
    assert plain[0].tokens is None


@pytest.fixture
def database(kz_env: Callable[..., Settings], tmp_path: Path) -> Iterator[None]:
    kz_env(database_url=f"sqlite:///{tmp_path / 'intake.db'}")
    migrate.upgrade()
    yield


@pytest.mark.slow  # a sandboxed evaluator
def test_a_training_generation_job_becomes_one_rollout_group_once(
    hf: HFChatModel, shared_evaluator: Evaluator, database: None
) -> None:
    sampling = Sampling(n=3, temperature=1.0, max_tokens=16, seed=5, logprobs=True)
    options = ScoreOptions(backend="triton", device="cpu", timeout_s=120)
    result = best_of_n(LLMKernelGenerator(hf), RELU, "triton", sampling, LocalScorer(shared_evaluator), options)
    assert all(c.tokens is not None and c.reply is not None for c in result.candidates)

    assert result.prompt is not None
    prompt_text = hf.render(result.prompt)
    group = record_coder_job("job-1", result, hf.render)
    assert record_coder_job("job-1", result, hf.render) == group  # the same job read again: stored once
    with session_scope() as session:
        rows = list(session.scalars(select(Rollout).where(Rollout.group_id == group).order_by(Rollout.created_at, Rollout.id)))
        stored = [(r.prompt, r.completion, r.completion_ids, r.behaviour_logps, r.status, r.reward) for r in rows]
    assert len(stored) == 3
    for (prompt, completion, ids, logps, status, reward), candidate in zip(stored, result.candidates):
        assert candidate.tokens is not None
        assert prompt == prompt_text and completion == candidate.reply
        assert ids == candidate.tokens.completion_ids and logps == candidate.tokens.logprobs
        judged = (NO_CODE, 0.0) if candidate.verdict is None else (candidate.verdict.status, candidate.verdict.reward)
        assert (status, reward) == judged


def verdict(status: str, reward: float) -> ScoredVerdict:
    return ScoredVerdict(status=status, reason="", reward=reward)  # type: ignore[arg-type]


def test_each_candidate_counts_by_its_verdict() -> None:
    result = KernelResult(
        correct=True,
        reason="",
        model="m",
        backend="triton",
        correct_fraction=0.25,
        prompt=MESSAGES,
        candidates=[
            CandidateReport(index=0, model="m", source="a", verdict=verdict("correct", 1.2), reply="reasoning a"),
            CandidateReport(index=1, model="m", source="b", verdict=verdict("incorrect", 0.0)),
            CandidateReport(index=2, model="m", source=None, declined="no program", reply="just talk"),
            CandidateReport(index=3, model="m", source="d", verdict=verdict("unverified", 0.0)),
            CandidateReport(index=4, model="m", source="e"),  # the reward service gave no verdict
        ],
    )
    samples = coder_samples(result, lambda messages: "|".join(m["content"] for m in messages))
    assert [(s.status, s.reward) for s in samples] == [
        ("correct", 1.2),
        ("incorrect", 0.0),
        (NO_CODE, 0.0),
        (UNSCORED, None),
        (UNSCORED, None),
    ]
    assert [s.completion for s in samples] == ["reasoning a", "b", "just talk", "d", "e"]
    assert {s.prompt for s in samples} == {"You write GPU kernels.|Write a ReLU kernel."}


def test_rewards_are_the_runs_ca_grpo_over_the_whole_group() -> None:
    """The reward service scored the one distinct correct source once (its group: all correct, so the
    speed term paid); over the job's eight replies, five with no program, 3/8 are correct, below the
    threshold: no speed term. The run's own CA-GRPO settings apply."""
    fast = ScoredVerdict(status="correct", reason="", reward=1.2, speedup=3.0)  # type: ignore[arg-type]
    candidates = [CandidateReport(index=i, model="m", source="a", verdict=fast) for i in range(3)]
    candidates += [CandidateReport(index=3 + i, model="m", source=None, declined="no program") for i in range(5)]
    result = KernelResult(
        correct=True, reason="", model="m", backend="triton", correct_fraction=1.0, prompt=MESSAGES, candidates=candidates
    )
    render = "|".join
    assert [s.reward for s in coder_samples(result, lambda m: render(x["content"] for x in m))] == [1.0] * 3 + [0.0] * 5
    always = CAGRPOConfig(speed_reward="always")
    rewarded = [s.reward for s in coder_samples(result, lambda m: render(x["content"] for x in m), always)]
    assert all(r is not None and r > 1.0 for r in rewarded[:3]) and rewarded[3:] == [0.0] * 5
