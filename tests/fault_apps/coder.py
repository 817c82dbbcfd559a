"""The coder worker with a generator that draws new candidates at every call, as a sampling model does:
an attempt that generated again would score a different group than the attempt before it."""

from __future__ import annotations

import uuid
from typing import Any

from coder_svc.drafts import KernelBackend, KernelDraft
from coder_svc.service import GeneratorCache, run_generate_job
from services.db.serving import ServingVersion
from services.llm.chat import Sampling
from services.queue.names import GENERATE_TASK
from services.queue.worker import create_worker_app
from services.schemas.serving import ModelBackend


class RandomDrafts:
    name = "random-drafts"
    thread_safe = True

    def generate(self, module_source: str, backend: KernelBackend, sampling: Sampling) -> list[KernelDraft]:
        verdicts = ["correct", "wrong"]
        return [
            KernelDraft(source=f"# {uuid.uuid4().hex}: {verdicts[i % 2]}\n", raw="", model=self.name) for i in range(sampling.n)
        ]


class RandomGenerators(GeneratorCache):
    def get(self, kind: ModelBackend, version: ServingVersion | None) -> RandomDrafts:
        return RandomDrafts()


def generate_job(job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    return run_generate_job(RandomGenerators(), job_id, payload)


app = create_worker_app("coder", {GENERATE_TASK: generate_job})
