"""README.md's examples, extracted, so they cannot drift from the code again: every ``kernelzero`` command
line names a command that exists with options it has; every curl body says it is JSON; every shell
variable is defined before it is used; ``kernelzero`` is used bare only after the environment is
activated; every Python block compiles; and the reward service's curl example runs for real."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import click
import typer

from kernelzero.cli import app
from reward_cases import CORRECT, RELU_REFERENCE

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", README, re.M | re.S)


def shell_lines() -> list[str]:
    """Each bash block's logical lines (continuations joined), heredoc bodies left out."""
    lines: list[str] = []
    for block in blocks("bash"):
        heredoc_end = None
        for line in block.replace("\\\n", " ").splitlines():
            if heredoc_end is not None:
                heredoc_end = None if line.strip() == heredoc_end else heredoc_end
                continue
            if match := re.search(r"<<'?(\w+)'?", line):
                heredoc_end = match.group(1)
            lines.append(line)
    return lines


def kernelzero_commands() -> list[list[str]]:
    """The words after ``kernelzero`` on each line that runs it (placeholders in brackets dropped)."""
    found = []
    for line in shell_lines():
        line = re.sub(r"\s+#.*$", "", line)
        match = re.match(r"^\s*(?:[A-Z_]+=\S+\s+)*(?:\.venv/bin/)?kernelzero\s+(.*)$", line)
        if match:
            found.append(shlex.split(re.sub(r"\[[^\]]*\]", "", match.group(1).split("|")[0])))
    return found


def test_every_kernelzero_command_line_names_a_command_and_its_options() -> None:
    root = typer.main.get_command(app)
    commands = kernelzero_commands()
    assert len(commands) >= 10, commands
    wrong = []
    for words in commands:
        command: Any = root
        rest = list(words)
        while hasattr(command, "list_commands") and rest and not rest[0].startswith("-"):  # a group (typer's own class)
            sub = command.get_command(click.Context(command), rest[0])
            if sub is None:
                wrong.append(f"kernelzero {' '.join(words)}: no command {rest[0]!r}")
                break
            command, rest = sub, rest[1:]
        options = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
        wrong += [
            f"kernelzero {' '.join(words)}: no option {word}"
            for word in rest
            if word.startswith("-") and word.split("=")[0] not in options
        ]
    assert not wrong, wrong


def test_curl_bodies_are_json_and_variables_are_defined_before_use() -> None:
    defined = {"PWD", "HOME"}
    problems = []
    for line in shell_lines():
        used = set(re.findall(r"\$\{?([A-Z_]+)\}?", line)) - defined
        if used:
            problems.append(f"{sorted(used)} used before it is defined: {line.strip()}")
        defined |= set(re.findall(r"(?:^|\s)([A-Z_]+)=", line))
        if "curl " in line and re.search(r"\s(-d|--data\S*)\s", line) and "Content-Type: application/json" not in line:
            problems.append(f"a curl body without a JSON content type: {line.strip()}")
    assert not problems, problems


def test_kernelzero_is_used_bare_only_after_the_environment_is_activated() -> None:
    activation = README.index("source .venv/bin/activate")
    first_bare = min(m.start() for m in re.finditer(r"^(?:[A-Z_]+=\S+\s+)*kernelzero ", README, re.M))
    assert activation < first_bare


def test_python_blocks_compile_and_kernelbench_says_where_it_comes_from() -> None:
    for block in blocks("python"):
        compile(block, "README.md", "exec")
    assert "git clone https://github.com/ScalingIntelligence/KernelBench" in README


def test_the_reward_curl_example_runs(reward_service: str, tmp_path: Path) -> None:
    [block] = [b for b in blocks("bash") if "/v1/score/group" in b]
    lines = block.splitlines()
    key_line = next(line for line in lines if line.startswith("KEY="))
    start = next(i for i, line in enumerate(lines) if line.startswith("curl ") and "/v1/score/group" in line)
    curl = "\n".join(lines[start : start + 2])  # the command and its continuation
    url = urlparse(reward_service)
    (tmp_path / "home" / ".kernelzero").mkdir(parents=True)
    (tmp_path / "home" / ".kernelzero" / "api-key").write_text("kz_unused_auth_is_off\n")
    (tmp_path / "ref.py").write_text(RELU_REFERENCE)
    (tmp_path / "cand.py").write_text(CORRECT)
    script = f"{key_line}\n{curl.replace('localhost:8103', f'{url.hostname}:{url.port}')}"
    run = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=tmp_path,
        env={"HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    assert answer["job_status"] == "succeeded" and answer["result"]["verdicts"][0]["status"] == "correct"
