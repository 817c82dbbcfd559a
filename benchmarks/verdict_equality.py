"""Whether two throughput runs gave the same verdicts: the issue's "verdicts unchanged" check between a
change and its baseline (``kernelbench_throughput.py run`` rows of the same candidates, e.g. the device
exchange off and on). Samples are matched by name; a verdict is its status, whether it is correct, and
the guard that caught it. Samples only one run finished (a run cut at a time limit) are listed, not
compared.

    python benchmarks/verdict_equality.py runs/files/ours_rows.jsonl runs/exchange/ours_rows.jsonl

Prints a table (and ``--json PATH`` writes the comparison); exits 1 where a verdict differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def load_rows(path: Path) -> dict[str, dict[str, Any]]:
    """A run's rows by sample name: a rows file (JSON lines) or a run's report (its ``rows``)."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        rows = json.loads(text)["rows"]
    return {row["problem"]: row for row in rows}


def verdict(row: dict[str, Any]) -> tuple[str, bool, str | None]:
    return row.get("status", "?"), bool(row.get("correct")), row.get("guard")


def compare(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict[str, Any]:
    both = sorted(before.keys() & after.keys())
    differ = [
        {"sample": name, "before": verdict(before[name]), "after": verdict(after[name]), "reason": after[name].get("reason", "")}
        for name in both
        if verdict(before[name]) != verdict(after[name])
    ]
    return {
        "compared": len(both),
        "same": len(both) - len(differ),
        "differ": differ,
        "only_before": sorted(before.keys() - after.keys()),
        "only_after": sorted(after.keys() - before.keys()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="the baseline run's rows (.jsonl) or report (.json)")
    parser.add_argument("after", type=Path, help="the changed run's rows or report")
    parser.add_argument("--json", type=Path, help="write the comparison here")
    args = parser.parse_args()
    result = compare(load_rows(args.before), load_rows(args.after))
    console = Console()
    table = Table(title=f"verdicts: {args.before} against {args.after}")
    for column in ("compared", "same", "differ", "only before", "only after"):
        table.add_column(column, justify="right")
    table.add_row(
        *(str(n) for n in (result["compared"], result["same"], len(result["differ"]))),
        *(str(len(result[k])) for k in ("only_before", "only_after")),
    )
    console.print(table)
    for row in result["differ"]:
        console.print(f"[red]{row['sample']}[/red]: {row['before']} -> {row['after']}: {row['reason'][:160]}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    sys.exit(1 if result["differ"] else 0)


if __name__ == "__main__":
    main()
