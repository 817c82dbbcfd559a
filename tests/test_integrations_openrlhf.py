"""OpenRLHF's remote reward protocol on the reward service (``POST /v1/get_reward``), called as OpenRLHF
0.11.2's rollout workers call it (``openrlhf/utils/agent.py``, ``SingleTurnAgentExecutor._fetch_rewards_via_http``:
aiohttp, no headers, ``{query, prompts, labels}``, ``raise_for_status``, five tries a second apart)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import httpx

from coder_svc import kernel_messages
from reward_cases import CORRECT, RELU_REFERENCE, candidate
from servers import serve
from services import auth
from services.config import Settings

WRONG = candidate("out = torch.empty_like(x)\nlaunch_relu(x, out)\nreturn out + 1.0")
# The Coder's own prompt: it shows an example ModelNew, which must never be taken for the model's answer.
PROMPT = "\n".join(m["content"] for m in kernel_messages(RELU_REFERENCE, "triton"))


def post_as_openrlhf(url: str, queries: list[str], prompts: list[str], labels: list[str]) -> Any:
    """``_post_request``: ``session.post(url, json=data)``, ``raise_for_status``, ``response.json()``, 5 tries."""

    async def post() -> Any:
        timeout = aiohttp.ClientTimeout(total=180)
        data = {"query": queries, "prompts": prompts, "labels": labels}
        for _ in range(5):
            try:
                async with aiohttp.ClientSession(timeout=timeout) as session:
                    async with session.post(url, json=data) as response:
                        response.raise_for_status()
                        return await response.json()
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(1)
        raise RuntimeError("Request error for 5 times")

    return asyncio.run(post())


def reply(source: str) -> str:
    return f"<|assistant|>Here it is.\n```python\n{source}\n```"


def test_rewards_for_queries_in_openrlhfs_call_shape(reward_service: str) -> None:
    url = f"{reward_service}/v1/get_reward?device=cpu"
    queries = [PROMPT + reply(CORRECT), PROMPT + reply(WRONG), PROMPT + "<|assistant|>I would rather not."]
    answer = post_as_openrlhf(url, queries, [PROMPT] * 3, [RELU_REFERENCE] * 3)
    assert answer["rewards"] == [1.0, 0.0, 0.0]  # the third: the prompt's example ModelNew was not taken for a reply
    assert answer["scores"] == [1.0, 0.0, 0.0]
    assert answer["extra_logs"]["scored"] == [1.0, 1.0, 1.0]
    assert set(answer["extra_logs"]) == {"correct", "scored", "speedup"}


def test_a_single_query_as_a_rollout_worker_sends_it(reward_service: str) -> None:
    answer = post_as_openrlhf(f"{reward_service}/v1/get_reward?device=cpu", [PROMPT + reply(CORRECT)], [PROMPT], [RELU_REFERENCE])
    assert answer["rewards"] == [1.0]


def test_samples_that_do_not_line_up_get_a_422_with_the_reason(reward_service: str) -> None:
    response = httpx.post(f"{reward_service}/v1/get_reward", json={"query": ["a", "b"], "labels": [RELU_REFERENCE]}, timeout=10)
    assert response.status_code == 422
    assert "one entry per sample" in response.text and "'query': 2" in response.text


def test_the_key_may_come_in_the_url_on_this_route_only(
    platform_env: Callable[..., Settings], free_port: Callable[[], int]
) -> None:
    platform_env(auth_enabled="true")
    _, key = auth.create_api_key("openrlhf")
    body = {"query": ["x"], "labels": []}  # refused by validation: proves the key was accepted first
    with serve("reward_svc.api:app", free_port()) as url:
        assert httpx.post(f"{url}/v1/get_reward", json=body).status_code == 401
        assert httpx.post(f"{url}/v1/get_reward?key=wrong", json=body).status_code == 401
        assert httpx.post(f"{url}/v1/get_reward?key={key}", json=body).status_code == 422
        assert httpx.post(f"{url}/v1/score?key={key}", json={}).status_code == 401  # other routes: headers only


def test_the_sdk_calls_the_same_route(reward_service: str) -> None:
    from services.clients import RewardClient
    from services.schemas.reward import RemoteRewardRequest

    with RewardClient(reward_service) as client:
        answer = client.get_reward(
            RemoteRewardRequest(query=[PROMPT + reply(CORRECT)], prompts=[PROMPT], labels=[RELU_REFERENCE]), device="cpu"
        )
    assert answer.rewards == [1.0] and answer.scores == [1.0]


def test_groups_still_scoring_answer_503_and_the_same_request_picks_them_up(reward_service: str) -> None:
    # a source no other test scores (a line outside the fence would be left out by the extractor): its job is new
    body = {"query": [PROMPT + reply(CORRECT + "\n# scored late")], "prompts": [PROMPT], "labels": [RELU_REFERENCE]}
    early = httpx.post(f"{reward_service}/v1/get_reward?device=cpu&wait_s=0", json=body, timeout=30)
    assert early.status_code == 503 and early.headers["retry-after"] == "1"  # what OpenRLHF's client retries
    assert "still scoring" in early.json()["detail"]
    later = httpx.post(f"{reward_service}/v1/get_reward?device=cpu&wait_s=150", json=body, timeout=180)
    assert later.status_code == 200 and later.json()["rewards"] == [1.0]
    job = early.json()["detail"].split("jobs ")[1].split(")")[0]
    assert httpx.get(f"{reward_service}/v1/jobs/{job}", timeout=10).json()["status"] == "succeeded"  # the same job, not a second
