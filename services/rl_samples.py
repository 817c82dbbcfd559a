"""RL samples scored in groups: the completions of one prompt (same reference module and backend) are one
group for the reward service, since CA-GRPO's threshold is a property of a group. The rules every RL
entry point shares (the TRL and verl adapters in ``integrations/``, the reward service's OpenRLHF route):

- the kernel is pulled from the raw completion with the Coder's extractor (``services.llm.extract``);
  a completion with no program defining ``ModelNew`` earns 0.0, what an incorrect kernel earns: it was
  judged, and it failed;
- a sample the service could not judge (no answer, the job failed or ran out of time, an ``unverified``
  verdict: no device to check it on) gets ``None`` rather than a made-up number, for the caller to leave
  out (TRL does) or to report (verl and OpenRLHF, which cannot leave a sample out).

Pure functions: who sends the groups, and how, is the caller's.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from services.llm.extract import extract_code
from services.schemas.coder import KernelBackendName
from services.schemas.reward import MAX_GROUP_CANDIDATES, GroupScoreResponse, ScoredVerdict

NO_PROGRAM = "the completion holds no Python program defining ModelNew"


@dataclass(frozen=True)
class Sample:
    """One completion to score: ``prompt_key`` is the same for every completion of one prompt."""

    prompt_key: Hashable
    reference: str
    completion: str
    backend: KernelBackendName = "triton"


@dataclass(frozen=True)
class SampleScore:
    """A sample's reward (None: not scored, the reason says why) and the service's verdict, where it gave one."""

    reward: float | None
    reason: str
    verdict: ScoredVerdict | None = None

    @property
    def correct(self) -> bool:
        return self.verdict is not None and self.verdict.correct


@dataclass
class Group:
    """The samples of one prompt: their indices in the batch, and the kernels extracted from them."""

    reference: str
    backend: KernelBackendName
    indices: list[int] = field(default_factory=list)
    kernels: list[str | None] = field(default_factory=list)

    @property
    def candidates(self) -> list[str]:
        return [k for k in self.kernels if k is not None]


def regroup(samples: Sequence[Sample]) -> list[Group]:
    """The samples by prompt (and reference and backend), in order of first appearance, kernels extracted."""
    groups: dict[tuple[Hashable, str, str], Group] = {}
    for index, sample in enumerate(samples):
        key = (sample.prompt_key, sample.reference, sample.backend)
        group = groups.setdefault(key, Group(sample.reference, sample.backend))
        group.indices.append(index)
        group.kernels.append(extract_code(sample.completion))
    too_big = [len(g.candidates) for g in groups.values() if len(g.candidates) > MAX_GROUP_CANDIDATES]
    if too_big:
        raise ValueError(f"a group of {max(too_big)} kernels: the reward service scores at most {MAX_GROUP_CANDIDATES} per group")
    return list(groups.values())


def group_scores(group: Group, answer: GroupScoreResponse | Exception | None) -> list[SampleScore]:
    """Each of the group's samples' score, from the service's answer (None: nothing was sent, no kernels)."""
    verdicts: list[ScoredVerdict] | None = None
    failure = ""
    if isinstance(answer, Exception):
        failure = f"not scored: {type(answer).__name__}: {answer}"
    elif answer is not None and answer.result is None:
        failure = f"not scored: job {answer.job_id} {answer.job_status}" + (f": {answer.error}" if answer.error else "")
    elif answer is not None and answer.result is not None:
        verdicts = list(answer.result.verdicts)
    scores = []
    for kernel in group.kernels:
        if kernel is None:
            scores.append(SampleScore(0.0, NO_PROGRAM))
        elif verdicts is None:
            scores.append(SampleScore(None, failure))
        else:
            verdict = verdicts.pop(0)
            reward = None if verdict.status == "unverified" else verdict.reward
            scores.append(SampleScore(reward, verdict.reason, verdict))
    return scores


def in_batch_order(
    samples: Sequence[Sample], groups: list[Group], answers: Sequence[GroupScoreResponse | Exception | None]
) -> list[SampleScore]:
    ordered: list[SampleScore | None] = [None] * len(samples)
    for group, answer in zip(groups, answers, strict=True):
        for index, score in zip(group.indices, group_scores(group, answer), strict=True):
            ordered[index] = score
    return [score for score in ordered if score is not None]


def completion_after_prompt(text: str, prompt: str | None) -> str:
    """The completion in a text that may start with its prompt (OpenRLHF's ``query`` is prompt and
    response decoded together): what follows the prompt's last occurrence, else the whole text. The
    prompt is cut off so that a program in it (the Coder's prompt shows an example ``ModelNew``) is never
    taken for the model's answer."""
    if prompt and prompt in text:
        return text.rsplit(prompt, 1)[1]
    return text
