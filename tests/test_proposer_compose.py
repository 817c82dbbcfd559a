"""The API catalog, the programmatic and LLM composers, and API-set sampling.

Composed modules are our own generated code, so the tests exec them in-process and run forward.
"""

from __future__ import annotations

import warnings
from collections import Counter
from random import Random
from typing import Any

import pytest
import torch

from proposer_svc.catalog import CATALOG
from proposer_svc.compose.base import ProposalHints, ProposedModule
from proposer_svc.compose.llm import LLMComposer
from proposer_svc.compose.programmatic import ProgrammaticComposer
from proposer_svc.sampling import catalog_stats, sample_api_set
from proposer_svc.stats import ApiStats
from services.llm.chat import Completion, Message, Sampling
from services.outcomes import Declined

COMPOSER = ProgrammaticComposer()


def run_module(
    module: ProposedModule, input_seed: int = 0, weight_seed: int = 0, inputs: list[torch.Tensor] | None = None
) -> tuple[Any, list[torch.Tensor], torch.Tensor]:
    namespace: dict[str, Any] = {}
    exec(compile(module.source, "<composed>", "exec"), namespace)
    torch.manual_seed(weight_seed)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    torch.manual_seed(input_seed)
    inputs = inputs if inputs is not None else namespace["get_inputs"]()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model, inputs, model(*inputs)


def changed(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.double(), b.double()
    return a.shape != b.shape or not torch.allclose(a, b, rtol=1e-6, atol=1e-6 * float(a.abs().max()))


def check_module(module: ProposedModule) -> None:
    """Loads, runs, has the declared shapes, is finite, and depends on every input and parameter."""
    model, inputs, out = run_module(module)
    assert [list(t.shape) for t in inputs] == module.input_shapes
    assert list(out.shape) == module.details["output_shape"]
    assert str(out.dtype).removeprefix("torch.") == module.details["output_dtype"]
    assert torch.isfinite(out.double()).all(), module.source
    _, alternatives, _ = run_module(module, input_seed=1)
    for i in range(len(inputs)):
        other = list(inputs)
        other[i] = alternatives[i]
        _, _, out2 = run_module(module, inputs=other)
        assert changed(out, out2), f"output ignores input {i}:\n{module.source}"
    for name, param in model.named_parameters():
        with torch.no_grad():
            param.add_(torch.randn_like(param) * 0.5 + 0.5)
            out2 = model(*inputs)
            assert changed(out, out2), f"output ignores parameter {name}:\n{module.source}"


# --- catalog -----------------------------------------------------------------------------------


def test_catalog_is_broad_and_canonical() -> None:
    assert len(CATALOG) >= 80
    kinds = Counter(e.kind for e in CATALOG.values())
    for kind in ("pointwise", "activation", "binary", "reduction", "softmax", "norm", "linear", "conv", "pool", "shape", "loss"):
        assert kinds[kind] >= 2, kind
    for name, e in CATALOG.items():
        assert name.startswith(("torch.", "Tensor.")), name
        assert e.ranks and all(1 <= r <= 5 for r in e.ranks)
        assert (e.layer is None) == ("{m}" not in e.call), name
    for name in (
        "torch.nn.Conv2d",
        "torch.nn.functional.softmax",
        "torch.nn.LayerNorm",
        "torch.logsumexp",
        "torch.nn.functional.cross_entropy",
        "Tensor.view",
        "torch.matmul",
        "torch.nn.GroupNorm",
    ):
        assert name in CATALOG


@pytest.mark.parametrize("api", sorted(CATALOG))
def test_every_catalog_entry_composes_alone(api: str) -> None:
    module = COMPOSER.compose([api], ProposalHints(difficulty=0.0, seed=1))
    assert module.details["placed"] == [api]
    # The recorded API set is mined from the source: the catalog's names are the miner's names.
    assert api in module.api_set
    _, _, out = run_module(module)
    assert list(out.shape) == module.details["output_shape"]
    assert torch.isfinite(out.double()).all()


# --- programmatic composer ---------------------------------------------------------------------


@pytest.mark.slow
def test_composed_modules_from_sampled_sets_run_and_are_nontrivial() -> None:
    rng = Random(7)
    stats = catalog_stats(CATALOG)
    placed_counts = []
    for seed in range(25):
        api_set = sample_api_set(stats, CATALOG, rng.randint(2, 6), rng)
        module = COMPOSER.compose(api_set, ProposalHints(difficulty=rng.uniform(0, 0.4), seed=seed))
        assert module.origin == "composer"
        assert set(module.details["placed"]) <= set(api_set)
        assert set(module.details["placed"]) <= set(module.api_set)
        check_module(module)
        placed_counts.append(len(module.details["placed"]))
    assert sum(placed_counts) / len(placed_counts) >= 2  # APIs are chained, not placed one at a time


@pytest.mark.slow
@pytest.mark.parametrize(
    "api_set",
    [
        ["torch.nn.Conv2d", "torch.nn.BatchNorm2d", "torch.nn.functional.relu"],
        ["torch.nn.Linear", "torch.nn.LayerNorm", "torch.nn.functional.gelu", "torch.add"],
        ["torch.nn.Conv3d", "torch.mul", "torch.nn.InstanceNorm3d", "torch.amax"],
        ["torch.nn.Conv1d", "torch.add", "torch.nn.GroupNorm", "torch.softmax", "torch.sum"],
        ["torch.nn.ConvTranspose2d", "torch.nn.MaxPool2d", "torch.nn.functional.hardtanh", "torch.amin"],
        ["torch.nn.Linear", "torch.nn.functional.log_softmax", "torch.nn.functional.nll_loss"],
        ["torch.exp", "torch.log", "torch.sqrt", "torch.cumprod", "torch.div"],
    ],
)
def test_known_pitfalls_stay_valid(api_set: list[str]) -> None:
    """Norms after biases, sums over softmax dims, extremes of saturated values, domains of log/sqrt."""
    for seed in range(3):
        check_module(COMPOSER.compose(api_set, ProposalHints(difficulty=0.2, seed=seed)))


def test_composer_follows_shapes_and_glues_ranks() -> None:
    module = COMPOSER.compose(
        ["torch.nn.Conv2d", "torch.nn.Linear", "torch.nn.functional.cross_entropy"], ProposalHints(difficulty=0.3, seed=3)
    )
    assert module.details["placed"] == ["torch.nn.Conv2d", "torch.nn.Linear", "torch.nn.functional.cross_entropy"]
    assert "Tensor.flatten" in module.details["glue"]  # conv output (4-d) folded for the 2-d cross entropy
    assert module.input_shapes[0][0] == module.input_shapes[1][0]  # targets per sample
    check_module(module)


def test_composer_is_deterministic_and_difficulty_scales_work() -> None:
    api_set = ["torch.nn.Conv2d", "torch.relu", "torch.add", "torch.mean"]
    a = COMPOSER.compose(api_set, ProposalHints(seed=11))
    assert a.source == COMPOSER.compose(api_set, ProposalHints(seed=11)).source
    assert len({COMPOSER.compose(api_set, ProposalHints(seed=s)).source for s in range(8)}) > 4
    easy = [COMPOSER.compose(api_set, ProposalHints(difficulty=0.0, seed=s)).details["flops"] for s in range(10)]
    hard = [COMPOSER.compose(api_set, ProposalHints(difficulty=1.0, seed=s)).details["flops"] for s in range(10)]
    assert sum(hard) > 4 * sum(easy)


def test_composer_keeps_to_max_ops_and_declines_what_it_cannot_place() -> None:
    many = ["torch.relu", "torch.sigmoid", "torch.tanh", "torch.exp", "torch.abs", "torch.sin", "torch.cos"]
    assert len(COMPOSER.compose(many, ProposalHints(max_ops=3, seed=0)).details["placed"]) == 3
    with pytest.raises(Declined, match="catalog"):
        COMPOSER.compose(["torch.not_an_op", "my.custom_layer"], ProposalHints(seed=0))
    # An argmax ends the chain as integers: the float op after it cannot be placed and is said so.
    module = COMPOSER.compose(["torch.argmax", "torch.nn.functional.softmax"], ProposalHints(seed=0))
    assert module.details["placed"][-1] == "torch.argmax"


# --- sampling ----------------------------------------------------------------------------------


def skewed_stats() -> ApiStats:
    usage = {
        "torch.relu": 1000,
        "torch.nn.Linear": 300,
        "torch.sigmoid": 30,
        "torch.exp": 10,
        "torch.cumsum": 3,
        "not.in.catalog": 100000,
    }
    pairs = {("torch.nn.Linear", "torch.relu"): 250, ("torch.exp", "torch.sigmoid"): 9}
    return ApiStats(modules=1200, usage=usage, pairs=pairs)


def seed_counts(temperature: float, draws: int = 3000, **kw: Any) -> Counter[str]:
    rng = Random(0)
    catalog = ["torch.relu", "torch.nn.Linear", "torch.sigmoid", "torch.exp", "torch.cumsum"]
    return Counter(sample_api_set(skewed_stats(), catalog, 1, rng, temperature, **kw)[0] for _ in range(draws))


def test_sampling_temperature_concentrates_on_frequent_apis() -> None:
    cold, warm, hot = seed_counts(0.5), seed_counts(1.0), seed_counts(4.0)
    assert cold["torch.relu"] > warm["torch.relu"] > hot["torch.relu"]
    assert cold["torch.cumsum"] <= warm["torch.cumsum"] < hot["torch.cumsum"]
    assert abs(warm["torch.relu"] / 3000 - 1000 / 1343) < 0.04  # frequency ** 1 at temperature 1


def test_sampling_failure_bias_favours_failing_apis() -> None:
    rates = {"torch.exp": 1.0, "torch.relu": 0.0}
    plain = seed_counts(1.0)
    biased = seed_counts(1.0, failure_rates=rates, failure_bias=9.0)
    assert biased["torch.exp"] > 5 * max(1, plain["torch.exp"])
    assert seed_counts(1.0, failure_rates=rates, failure_bias=0.0) == plain


def test_sampling_follows_cooccurrence_and_restricts_to_catalog() -> None:
    rng = Random(1)
    catalog = ["torch.relu", "torch.nn.Linear", "torch.sigmoid", "torch.exp", "torch.cumsum"]
    partners = Counter()
    for _ in range(2000):
        drawn = sample_api_set(skewed_stats(), catalog, 2, rng)
        assert len(set(drawn)) == 2 and set(drawn) <= set(catalog)
        if drawn[0] == "torch.sigmoid":
            partners[drawn[1]] += 1
    assert partners.most_common(1)[0][0] == "torch.exp"  # sigmoid's only co-occurring API
    assert sample_api_set(skewed_stats(), catalog, 10, rng) and len(sample_api_set(skewed_stats(), catalog, 10, rng)) == 5


def test_sampling_without_statistics_is_uniform_over_the_catalog() -> None:
    rng = Random(2)
    catalog = sorted(CATALOG)[:10]
    counts = Counter(sample_api_set(ApiStats(), catalog, 1, rng)[0] for _ in range(5000))
    assert set(counts) == set(catalog)
    assert max(counts.values()) < 1.3 * min(counts.values())
    with pytest.raises(ValueError):
        sample_api_set(ApiStats(), catalog, 1, rng, temperature=0)


# --- LLM composer ------------------------------------------------------------------------------


class ScriptedChat:
    """A ChatModel that answers with canned replies and keeps the conversations it was sent."""

    backend = "scripted"

    def __init__(self, reply: str, model: str = "scripted-7b") -> None:
        self.reply, self.model, self.seen = reply, model, []

    def complete(self, messages: list[Message], sampling: Sampling) -> list[Completion]:
        self.seen.append((messages, sampling))
        return [Completion(text=self.reply, model=self.model, finish_reason="stop")]

    def describe(self) -> dict[str, Any]:
        return {"model": self.model}


LLM_REPLY = """Here is a task that uses the APIs.

```python
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = self.linear(x)
        x = F.gelu(x)
        return torch.logsumexp(x, dim=1)


batch_size = 64
in_features = 256
out_features = 128


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
```
It chains a linear layer, GELU and logsumexp."""


def test_llm_composer_extracts_a_module_from_the_reply() -> None:
    chat = ScriptedChat(LLM_REPLY)
    api_set = ["torch.nn.Linear", "torch.nn.functional.gelu", "torch.logsumexp", "torch.cumsum"]
    module = LLMComposer(chat).compose(api_set, ProposalHints(difficulty=0.7, seed=5, max_ops=4))
    assert module.origin == "llm:scripted-7b"
    assert module.source.startswith("import torch") and "It chains" not in module.source
    assert set(module.api_set) == {"torch.nn.Linear", "torch.nn.functional.gelu", "torch.logsumexp"}
    assert module.details["missing"] == ["torch.cumsum"]
    messages, sampling = chat.seen[0]
    assert sampling.seed == 5 and sampling.n == 1
    assert all(api in messages[-1]["content"] for api in api_set)
    assert "get_init_inputs" in messages[-1]["content"]
    _, _, out = run_module(module)
    assert out.shape == (64,)


@pytest.mark.parametrize(
    "reply, reason",
    [
        ("I cannot write that module, sorry.", "no program"),
        (
            "```python\nimport torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n```",
            "no program",
        ),
        (LLM_REPLY.replace("def forward(self, x):", "def forward(self, x, mask):"), "never uses its argument mask"),
    ],
)
def test_llm_composer_declines_replies_without_a_module(reply: str, reason: str) -> None:
    with pytest.raises(Declined, match=reason):
        LLMComposer(ScriptedChat(reply)).compose(["torch.relu"], ProposalHints(seed=0))
