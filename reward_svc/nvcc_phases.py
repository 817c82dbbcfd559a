"""``nvcc -c`` with its host and device front ends run side by side.

For one ``.cu`` nvcc runs seven steps strictly in sequence: preprocess for the host, ``cudafe++``
(parses the whole translation unit), preprocess for the device, ``cicc`` (parses it again, emits
PTX), ``ptxas``, ``fatbinary``, then the host compiler on cudafe++'s output. The two front ends
are independent but for one thing: cicc reads the *module id* that cudafe++ writes. With torch's
headers each front end takes seconds (on a 2-core machine, minimal header tier: cudafe++ 7.8 s,
cicc 4.4 s, host compile 3.5 s, 17 s in all), so this module

- asks nvcc for its plan (``--dryrun``, with ``--keep`` so every intermediate has a fixed name),
- writes a module id itself and removes ``--gen_module_id_file`` from cudafe++, so both front
  ends read the same id and neither waits for the other,
- runs branch host (preprocess, cudafe++) and branch device (preprocess, cicc, ptxas, fatbinary)
  in parallel, then the final host compile, which needs both.

The plan is used only when it has exactly the shape described; anything else (another nvcc
version, several target archs, ``-rdc``) compiles with one plain ``nvcc -c``, as does a failed
step, so a parallel plan can never turn a compilable source into a compile error.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

_EXPECTED_TOOLS = ("preprocess", "cudafe++", "preprocess", "cicc", "ptxas", "fatbinary", "compile")
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_GEN_MODULE_ID = "--gen_module_id_file"
_MODULE_ID_FILE = re.compile(r'--module_id_file_name\s+"?([^"\s]+)"?')


@dataclass(frozen=True)
class Phases:
    env: dict[str, str]
    host: list[str]
    device: list[str]
    final: list[str]
    module_id_file: Path


def toolchain_env() -> dict[str, str]:
    """This process's environment without nvcc's own flag variables (``NVCC_APPEND_FLAGS`` and kin):
    the flags of a build are the harness's, checked before it runs (reward_svc/policy/native.py)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("NVCC_")}


def compile_cu(nvcc_cmd: list[str], source: Path, output: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Compile ``source`` to ``output`` like ``nvcc_cmd -c source -o output``, front ends in parallel."""
    keep = cwd / "nvcc-keep"
    keep.mkdir(exist_ok=True)
    plain = [*nvcc_cmd, "-c", str(source), "-o", str(output)]
    env = toolchain_env()
    dry = subprocess.run(
        [*plain, "--dryrun", "--keep", "--keep-dir", str(keep)], cwd=cwd, capture_output=True, text=True, env=env
    )
    phases = parse_dryrun(dry.stdout + dry.stderr) if dry.returncode == 0 else None
    if phases is None:
        return subprocess.run(plain, cwd=cwd, capture_output=True, text=True, env=env)
    phases.module_id_file.write_text(module_id(source))
    with ThreadPoolExecutor(max_workers=2) as pool:
        branches = list(pool.map(lambda steps: _run_steps(steps, phases.env, cwd), (phases.host, phases.device)))
    failed = next((r for r in branches if r.returncode != 0), None)
    result = failed or _run_steps(phases.final, phases.env, cwd)
    if result.returncode != 0:
        # Let nvcc itself have the last word (and write the diagnostics users expect).
        return subprocess.run(plain, cwd=cwd, capture_output=True, text=True, env=env)
    return result


def parse_dryrun(text: str) -> Phases | None:
    """The three branches of nvcc's plan, or None when the plan is not the one we know."""
    lines = [line[3:] for line in text.splitlines() if line.startswith("#$ ")]
    env = toolchain_env()
    steps: list[str] = []
    for line in lines:
        match = _ASSIGNMENT.match(line)
        if match and " " not in match.group(1):
            value = match.group(2).strip()
            env[match.group(1)] = (
                value[1:-1] if len(value) > 1 and value[0] == value[-1] == '"' and value.count('"') == 2 else value
            )
        else:
            steps.append(line)
    if tuple(_tool(step) for step in steps) != _EXPECTED_TOOLS:
        return None
    cudafe, cicc = steps[1], steps[3]
    ids = _MODULE_ID_FILE.findall(cudafe), _MODULE_ID_FILE.findall(cicc)
    if _GEN_MODULE_ID not in cudafe or len(ids[0]) != 1 or ids[0] != ids[1]:
        return None
    steps[1] = cudafe.replace(_GEN_MODULE_ID, "", 1)
    return Phases(env, steps[0:2], steps[2:6], steps[6:7], Path(ids[0][0]))


def module_id(source: Path) -> str:
    """An id of cudafe++'s own shape (``_<hash>_<len>_<name>_<hash>``), unique to this source."""
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    name = re.sub(r"\W", "_", source.name)
    return f"_{digest[:8]}_{len(source.name)}_{name}_{digest[8:16]}"


def _tool(step: str) -> str:
    argv = shlex.split(step, posix=True)
    name = os.path.basename(argv[0]) if argv else ""
    if name in ("cudafe++", "cicc", "ptxas", "fatbinary"):
        return name
    if "-E" in argv:
        return "preprocess"
    if "-c" in argv:
        return "compile"
    return name


def _run_steps(steps: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.CompletedProcess(steps, 0, "", "")
    for step in steps:
        result = subprocess.run(["bash", "-c", step], cwd=cwd, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            break
    return result
