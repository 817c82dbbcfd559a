"""Where the reward evaluator's processes spend their time, from py-spy's raw stacks.

``py-spy record --subprocesses --idle --format raw`` samples every thread of the worker and of its
sandboxed children; this reads those stacks and prints, per role (the worker, reference children,
candidate children, children still warming up or waiting for a job), the thread-seconds under each
function (inclusive: a function counted once per stack) and at the leaf (where the thread was).

    python benchmarks/profile_summary.py stacks.txt [--rate 25] [--top 30]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from pathlib import Path

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]*)(?::\d+)?\)$")
ROLES = {"run_reference": "reference child", "run_candidate": "candidate child"}


def frame_name(frame: str) -> str:
    """``func (path/to/file.py:12)`` as ``func (file.py)``: lines of one function add up."""
    match = FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    return f"{match['func']} ({Path(match['file']).name})"


def role_of(frames: list[str]) -> str:
    for frame in frames:
        for function, role in ROLES.items():
            if frame.startswith(function + " "):
                return role
    if any(frame_name(frame) == "serve (entry.py)" for frame in frames):  # a pooled child's entry point
        return "child, no job yet"
    return "worker"


def summarise(lines: list[str], rate: float, top: int) -> str:
    inclusive: dict[str, Counter[str]] = defaultdict(Counter)
    leaf: dict[str, Counter[str]] = defaultdict(Counter)
    totals: Counter[str] = Counter()
    for line in lines:
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        role = role_of(frames)
        totals[role] += count
        for name in {frame_name(f) for f in frames}:
            inclusive[role][name] += count
        leaf[role][frame_name(frames[-1])] += count
    out = [f"py-spy stacks at {rate:g} Hz: thread-seconds per role (a thread idle in a wait counts too)"]
    for role, total in totals.most_common():
        out.append(f"\n== {role}: {total / rate:.1f} thread-s")
        out.append("-- inclusive")
        out += [f"{n / rate:9.1f}  {n / total:5.1%}  {name}" for name, n in inclusive[role].most_common(top)]
        out.append("-- leaf")
        out += [f"{n / rate:9.1f}  {n / total:5.1%}  {name}" for name, n in leaf[role].most_common(top // 2)]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stacks", type=Path, help="py-spy's --format raw output")
    parser.add_argument("--rate", type=float, default=25.0, help="the sampling rate py-spy recorded at")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    print(summarise(args.stacks.read_text(errors="replace").splitlines(), args.rate, args.top))


if __name__ == "__main__":
    main()
