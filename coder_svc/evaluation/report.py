"""An evaluation's report: ``summary.json``, ``summary.md`` (a table per level) and ``summary.png``."""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from coder_svc.evaluation.metrics import FAST_P, Outcome, summarize


def _outcomes(records: list[dict[str, Any]]) -> list[list[Outcome]]:
    by_problem: dict[str, list[Outcome]] = defaultdict(list)
    for r in records:
        by_problem[r["problem"]].append(Outcome(bool(r["correct"]), r.get("speedup")))
    return list(by_problem.values())


def _level_name(level: int | None) -> str:
    return "all problems" if level is None else f"level {level}"


def _mean(records: list[dict[str, Any]], key: str) -> float | None:
    return statistics.fmean(r[key] for r in records) if records else None


def _timed(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Samples whose timings mean something (an errored problem's time went nowhere in particular)."""
    return [r for r in records if r["status"] != "error"]


def build_summary(records: list[dict[str, Any]], samples: int, run: dict[str, Any]) -> dict[str, Any]:
    """Metrics per level and overall, status counts, which problems were solved, and the harness's timings."""
    ks = sorted({1, samples})
    levels: dict[str, Any] = {}
    for level in sorted({r["level"] for r in records}, key=lambda v: -1 if v is None else v):
        subset = [r for r in records if r["level"] == level]
        levels[_level_name(level)] = {
            **summarize(_outcomes(subset), ks),
            "statuses": dict(Counter(r["status"] for r in subset)),
            "solved": sorted({r["problem"] for r in subset if r["correct"]}),
            # Why the generator gave nothing, per problem: which families it does not cover.
            "declined": dict(
                Counter(r["reason"] for r in subset if r["status"] == "declined" and r["sample"] == 0).most_common()
            ),
        }
    return {
        **run,
        "samples_per_problem": samples,
        "levels": levels,
        "overall": summarize(_outcomes(records), ks),
        "timing_per_sample_s": {
            "generation_mean": _mean(_timed(records), "generation_s"),
            "evaluation_mean": _mean(_timed(records), "evaluation_s"),
            "harness_overhead_mean": _mean(_timed(records), "overhead_s"),
            "harness_overhead_median": statistics.median(r["overhead_s"] for r in _timed(records)) if _timed(records) else None,
        },
    }


def _fmt(value: float | None, percent: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{100 * value:.1f}%" if percent else f"{value:.3g}"


def markdown(summary: dict[str, Any]) -> str:
    ks = list(summary["overall"]["pass_at_k"])
    head = ["set", "problems", "samples", *[f"pass@{k}" for k in ks], *[f"fast_{p:g}" for p in FAST_P], "geomean speedup"]
    lines = [
        f"# Evaluation: {summary.get('model', '?')} on {summary.get('problems_dir', '?')} ({summary.get('backend', '?')})",
        "",
        "fast_p: expected share for one attempt (see coder_svc/evaluation/metrics.py); n/a: speed not measured.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    rows = (
        [*summary["levels"].items(), ("overall", summary["overall"])]
        if len(summary["levels"]) > 1
        else list(summary["levels"].items())
    )
    for name, m in rows:
        cells = [
            name,
            str(m["problems"]),
            str(m["samples"]),
            *[_fmt(m["pass_at_k"][k], True) for k in ks],
            *[_fmt(m["fast_p"][str(p)], True) for p in FAST_P],
            _fmt(m["geomean_speedup"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    timing = summary["timing_per_sample_s"]
    lines += [
        "",
        f"Per sample: generation {_fmt(timing['generation_mean'])} s, evaluation {_fmt(timing['evaluation_mean'])} s, "
        f"harness overhead {_fmt(timing['harness_overhead_mean'])} s (mean), "
        f"{_fmt(timing['harness_overhead_median'])} s (median).",
    ]
    for name, m in summary["levels"].items():
        statuses = ", ".join(f"{s} {c}" for s, c in sorted(m["statuses"].items()))
        lines += [
            "",
            f"## {name}",
            "",
            f"Statuses: {statuses}.",
            "",
            f"Solved ({len(m['solved'])}): {', '.join(m['solved']) or 'none'}.",
        ]
        if m["declined"]:
            lines += ["", "Declined (problems):", *[f"- {count}: {reason}" for reason, count in m["declined"].items()]]
    return "\n".join(lines) + "\n"


def plot(records: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    """Left: pass@k per level. Right: the fast_p curve per level (share of samples correct with speedup > p)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(summary["levels"])
    ks = list(summary["overall"]["pass_at_k"])
    width = 0.8 / len(ks)
    for j, k in enumerate(ks):
        left.bar(
            [i + j * width for i in range(len(names))],
            [summary["levels"][n]["pass_at_k"][k] or 0.0 for n in names],
            width,
            label=f"pass@{k}",
        )
    left.set_xticks([i + width * (len(ks) - 1) / 2 for i in range(len(names))], names)
    left.set_ylim(0, 1), left.set_ylabel("share of problems"), left.legend(), left.set_title("correctness")
    measured = [r for r in records if r["correct"] and r.get("speedup") is not None]
    if measured:
        top = max(3.0, max(r["speedup"] for r in measured) * 1.05)
        grid = [top * i / 200 for i in range(201)]
        for level in sorted({r["level"] for r in records}, key=lambda v: -1 if v is None else v):
            subset = [r for r in records if r["level"] == level]
            right.plot(
                grid,
                [sum(r["correct"] and (r.get("speedup") or 0) > p for r in subset) / len(subset) for p in grid],
                label=_level_name(level),
            )
        right.axvline(1.0, color="grey", linestyle=":")
        right.set_xlabel("speedup threshold p"), right.set_ylabel("share of samples"), right.legend()
    else:
        right.set_axis_off()
        right.text(
            0.5, 0.5, "speed not measured\n(no GPU: correctness only)", ha="center", va="center", transform=right.transAxes
        )
    right.set_title("fast_p")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(records: list[dict[str, Any]], samples: int, run: dict[str, Any], out: Path) -> dict[str, Any]:
    summary = build_summary(records, samples, run)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(markdown(summary))
    plot(records, summary, out / "summary.png")
    return summary
