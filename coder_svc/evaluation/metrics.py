"""KernelBench metrics over per-sample outcomes: pass@k, fast_p, geometric-mean speedup.

Definitions (a problem has n samples, c of them correct):

- pass@k: the unbiased estimator 1 - C(n-c, k) / C(n, k) (Chen et al., 2021), averaged over
  problems; defined for k <= n.
- fast_p (KernelBench): the share of problems solved by a correct kernel with speedup > p. With
  several samples per problem we report the expected value for *one attempt*: per problem, the
  share of its samples that are correct with speedup > p, averaged over problems (comparable to
  pass@1 and to KernelBench's single-sample fast_p). ``fast_p_best`` is the best-of-n variant:
  per problem, whether any sample qualifies. fast_0 is the correct share (every kernel that ran
  has a positive speedup). For p > 0, a correct sample whose speed was not measured (no GPU)
  makes fast_p unknown: None, never guessed.
- geometric-mean speedup over every correct sample with a measured speedup (None if none).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

FAST_P = (0.0, 1.0, 1.5, 2.0)


@dataclass(frozen=True)
class Outcome:
    correct: bool
    speedup: float | None = None


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n is correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(problems: Sequence[Sequence[Outcome]], k: int) -> float | None:
    usable = [p for p in problems if len(p) >= k]
    if not usable:
        return None
    return sum(pass_at_k(len(p), sum(o.correct for o in p), k) for p in usable) / len(usable)


def _qualifies(outcome: Outcome, p: float) -> bool | None:
    if not outcome.correct:
        return False
    if p == 0.0:
        return True
    return None if outcome.speedup is None else outcome.speedup > p


def fast_p(problems: Sequence[Sequence[Outcome]], p: float, best_of_n: bool = False) -> float | None:
    """See the module docstring; None when a correct sample's speed was not measured (p > 0)."""
    if not problems:
        return None
    shares = []
    for samples in problems:
        flags = [_qualifies(o, p) for o in samples]
        if None in flags:
            return None
        hits = sum(bool(f) for f in flags)
        shares.append(float(hits > 0) if best_of_n else hits / len(flags))
    return sum(shares) / len(shares)


def geometric_mean_speedup(problems: Sequence[Sequence[Outcome]]) -> float | None:
    speedups = [o.speedup for p in problems for o in p if o.correct and o.speedup is not None and o.speedup > 0]
    if not speedups:
        return None
    return math.exp(sum(math.log(s) for s in speedups) / len(speedups))


def summarize(problems: Sequence[Sequence[Outcome]], ks: Sequence[int]) -> dict[str, Any]:
    """Every metric for one set of problems (a level, or all)."""
    return {
        "problems": len(problems),
        "samples": sum(len(p) for p in problems),
        "correct_samples": sum(o.correct for p in problems for o in p),
        "pass_at_k": {str(k): mean_pass_at_k(problems, k) for k in ks},
        "fast_p": {str(p): fast_p(problems, p) for p in FAST_P},
        "fast_p_best": {str(p): fast_p(problems, p, best_of_n=True) for p in FAST_P},
        "geomean_speedup": geometric_mean_speedup(problems),
    }
