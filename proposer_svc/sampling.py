"""Sampling API sets from mined co-occurrence statistics.

The seed API is drawn by usage frequency to the power 1/temperature; every further API by its
(add-one smoothed) co-occurrence with the APIs already chosen, also tempered. Each weight is
multiplied by ``1 + failure_bias * failure_rate[api]`` so APIs the Coder currently fails on come up
more often. Only APIs in the catalog are drawn; with no statistics the draw is uniform over it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from itertools import combinations
from random import Random

from proposer_svc.stats import ApiStats


def sample_api_set(
    stats: ApiStats,
    catalog: Collection[str],
    size: int,
    rng: Random,
    temperature: float = 1.0,
    failure_rates: Mapping[str, float] | None = None,
    failure_bias: float = 0.0,
) -> list[str]:
    """``size`` distinct catalog APIs (fewer if the catalog is smaller), the seed first."""
    if temperature <= 0:
        raise ValueError("temperature must be positive")
    candidates = sorted(set(catalog))
    failure_rates = failure_rates or {}

    def favour(api: str, weight: float) -> float:
        return weight * (1.0 + failure_bias * failure_rates.get(api, 0.0))

    chosen: list[str] = []
    while candidates and len(chosen) < size:
        if not chosen:
            raw = [stats.usage.get(api, 0) for api in candidates]
            if not any(raw):  # no statistics for these APIs: uniform
                raw = [1] * len(candidates)
        else:
            raw = [1 + sum(_pair(stats, api, c) for c in chosen) for api in candidates]
        # w ** (1/T) in log space, scaled by the largest: a low temperature must not overflow.
        logs = [math.log(w) / temperature if w > 0 else -math.inf for w in raw]
        top = max(logs)
        weights = [favour(api, math.exp(lw - top)) for api, lw in zip(candidates, logs)]
        pick = rng.choices(candidates, weights=weights)[0]
        chosen.append(pick)
        candidates.remove(pick)
    return chosen


def _pair(stats: ApiStats, a: str, b: str) -> int:
    return stats.pairs.get((a, b) if a < b else (b, a), 0)


def catalog_stats(catalog: Collection[str]) -> ApiStats:
    """A flat baseline: every catalog API used once, in one module with every other (uniform sampling)."""
    names = sorted(set(catalog))
    return ApiStats(modules=1, usage={n: 1 for n in names}, pairs={p: 1 for p in combinations(names, 2)})
