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

The final host compile parses cudafe++'s output, torch's headers again as regenerated text. Where
that text begins with what a trusted probe unit's began with (the same headers, flags and
toolchain: ``HostPrefix``, built by :func:`build_host_prefix`), it starts instead from a GCC
precompiled header of that beginning. The two texts can differ in one way only, the name cudafe++
gives the host's anonymous namespaces (``_GLOBAL__N_<module id>``: hidden, internal to the unit),
which is renamed to the probe's before the texts are compared; whatever else differs, the unit
compiles from its own text. cudafe++ has precompiled headers of its own, but using one crashes it
(CUDA 13.0), so this is the one front end that starts from one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

_EXPECTED_TOOLS = ("preprocess", "cudafe++", "preprocess", "cicc", "ptxas", "fatbinary", "compile")
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_GEN_MODULE_ID = "--gen_module_id_file"
PREFIX_HEADER = "kz_host_prefix.h"
PREFIX_MODULE_ID = "module_id"
PREFIX_FLAGS = "host_flags.json"
_DIAGNOSTIC_PRAGMA = re.compile(r"^#pragma GCC diagnostic .*$", re.MULTILINE)


@dataclass(frozen=True)
class Phases:
    env: dict[str, str]
    host: list[str]
    device: list[str]
    final: list[str]
    module_id_file: Path
    host_output: Path  # cudafe++'s host code, what the final step compiles
    stub: Path  # the registration stub it includes, written by cicc


class CompiledCu(NamedTuple):
    result: subprocess.CompletedProcess[str]
    prefixed: bool  # the final host compile started from a precompiled prefix
    phases: Phases | None  # the parallel plan that compiled it (None: plain nvcc)


@dataclass(frozen=True)
class HostPrefix:
    """A precompiled beginning of cudafe++'s host output: ``header`` (its text, beside ``header.gch``), the
    module id of the probe it was cut from, and the final host compile's flags it was built with (``host_flags``:
    GCC uses a precompiled header only under the flags it was built with)."""

    header: Path
    module_id: str
    flags: tuple[str, ...]

    @classmethod
    def find(cls, directory: Path) -> HostPrefix | None:
        header, module, flags = directory / PREFIX_HEADER, directory / PREFIX_MODULE_ID, directory / PREFIX_FLAGS
        if not (module.is_file() and flags.is_file() and header.with_name(f"{PREFIX_HEADER}.gch").is_file()):
            return None
        return cls(header, module.read_text().strip(), tuple(json.loads(flags.read_text())))

    def start(self, host_text: str, stub_text: str, own_module_id: str) -> str | None:
        """``host_text`` (a unit's cudafe++ output, compiled with ``own_module_id``) made to include this prefix
        in place of the text it begins with; None where it does not begin with it.

        None too where the unit names the probe's id itself (its code would join the renamed namespaces: a
        ``using namespace`` of cudafe++'s makes their names visible) or its stub names a host namespace by
        the unit's id (cudafe++'s stubs name them through ``_NV_ANON_NAMESPACE``: a guard, never seen)."""
        own = re.compile(rf"(?<!\w)_GLOBAL__N_{re.escape(own_module_id)}(?!\w)")
        if self.module_id in host_text or self.module_id in stub_text or own.search(stub_text):
            return None
        renamed = own.sub(f"_GLOBAL__N_{self.module_id}", host_text)
        prefix = self.header.read_text()
        if own_module_id in renamed or not renamed.startswith(prefix):
            return None
        # GCC 12 loads a precompiled header without its diagnostic pragmas' state: what the text would have set
        pragmas = "".join(f"{line}\n" for line in _DIAGNOSTIC_PRAGMA.findall(prefix))
        return f'#include "{self.header}"\n{pragmas}' + renamed[len(prefix) :]


def toolchain_env() -> dict[str, str]:
    """This process's environment without nvcc's own flag variables (``NVCC_APPEND_FLAGS`` and kin):
    the flags of a build are the harness's, checked before it runs (reward_svc/policy/native.py)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("NVCC_")}


def compile_cu(
    nvcc_cmd: list[str],
    source: Path,
    output: Path,
    cwd: Path,
    host_prefixes: Sequence[HostPrefix] = (),
    same_text: Sequence[str] = (),
) -> CompiledCu:
    """Compile ``source`` to ``output`` like ``nvcc_cmd -c source -o output``, front ends in parallel, the
    final host compile from the one of ``host_prefixes`` built with its flags (``host_flags``) where the unit's
    host code begins with it."""
    keep = cwd / "nvcc-keep"
    keep.mkdir(exist_ok=True)
    # by its name where it can be: its path would be in the host code's first line, unlike any other unit's
    named = source.name if source.parent.resolve() == cwd.resolve() else str(source)
    plain = [*nvcc_cmd, "-c", named, "-o", str(output)]
    env = toolchain_env()
    dry = subprocess.run(
        [*plain, "--dryrun", "--keep", "--keep-dir", str(keep)], cwd=cwd, capture_output=True, text=True, env=env
    )
    phases = parse_dryrun(dry.stdout + dry.stderr) if dry.returncode == 0 else None
    if phases is None:
        return CompiledCu(subprocess.run(plain, cwd=cwd, capture_output=True, text=True, env=env), False, None)
    own_id = module_id(source)
    phases.module_id_file.write_text(own_id)
    with ThreadPoolExecutor(max_workers=2) as pool:
        branches = list(pool.map(lambda steps: _run_steps(steps, phases.env, cwd), (phases.host, phases.device)))
    failed = next((r for r in branches if r.returncode != 0), None)
    final, prefixed = phases.final, False
    flags = host_flags(phases, cwd, same_text)
    host_prefix = next((prefix for prefix in host_prefixes if prefix.flags == flags), None)
    if failed is None and host_prefix is not None:
        try:
            started = host_prefix.start(phases.host_output.read_text(), phases.stub.read_text(), own_id)
        except (OSError, ValueError):  # a prefix removed under it (another torch's, an upgrade): compile as it is
            started = None
        if started is not None:
            phases.host_output.write_text(started)
            final, prefixed = [f"{step} -Winvalid-pch" for step in phases.final], True
    result = failed or _run_steps(final, phases.env, cwd)
    if result.returncode != 0:
        # Let nvcc itself have the last word (and write the diagnostics users expect).
        return CompiledCu(subprocess.run(plain, cwd=cwd, capture_output=True, text=True, env=env), False, phases)
    return CompiledCu(result, prefixed and f"{PREFIX_HEADER}.gch: not used" not in result.stderr, phases)


def build_host_prefix(
    nvcc_cmd: list[str], source: Path, target: Path, prelude: str, same_text: Sequence[str] = ()
) -> HostPrefix | None:
    """Compile the probe ``source``, whose first line includes ``prelude`` (a header that includes the others,
    then declares its own), and precompile into ``target`` its host code up to ``prelude``'s own declarations:
    what every unit opening with the same headers under the same flags begins with. None where the probe
    does not compile in parallel phases or GCC cannot precompile its prefix (a prefix that ends inside a
    declaration does not compile as a header). The probe's module id is salted: no unit can know it."""
    source.write_text(f"{source.read_text()}// kz: probe {uuid.uuid4().hex}\n")
    compiled = compile_cu(nvcc_cmd, source, source.with_suffix(".o"), source.parent)
    if compiled.result.returncode != 0 or compiled.phases is None:
        return None
    phases = compiled.phases
    text = phases.host_output.read_text()
    own = re.search(rf'^# \d+ "{re.escape(prelude)}"$', text, re.MULTILINE)
    prefix = text[: own.start()] if own else ""
    if not prefix:
        return None
    argv = shlex.split(phases.final[0])
    if not {"-c", "-x", "-o", str(phases.host_output)} <= set(argv):
        return None
    header = target / PREFIX_HEADER
    argv[argv.index("-x") + 1] = "c++-header"  # the final compile's own flags: GCC uses a header built with them
    argv[argv.index("-o") + 1] = str(header.with_name(f"{PREFIX_HEADER}.gch"))
    argv = [str(header) if a == str(phases.host_output) else a for a in argv if a != "-c"]
    target.mkdir(parents=True, exist_ok=True)
    header.write_text(prefix)
    if subprocess.run(argv, cwd=source.parent, env=phases.env, capture_output=True, text=True).returncode != 0:
        return None
    (target / PREFIX_MODULE_ID).write_text(module_id(source))
    (target / PREFIX_FLAGS).write_text(json.dumps(host_flags(phases, source.parent, same_text)))
    return HostPrefix.find(target)


def host_flags(phases: Phases, unit_dir: Path, same_text: Sequence[str]) -> tuple[str, ...]:
    """The final host compile's flags, less its input and output: what decides whether GCC takes a precompiled
    header. Less too the include directories inside ``unit_dir`` (the unit's own copies of torch's operator
    headers, which host code never includes again), and with the directories of ``same_text`` (a compile-only
    machine's stub headers, the same text in every process's own cache) named alike."""
    argv = shlex.split(phases.final[0])
    if "-o" in argv:
        del argv[argv.index("-o") : argv.index("-o") + 2]
    flags = [a for a in argv if a not in ("-c", str(phases.host_output)) and not a.startswith(f"-I{unit_dir}")]
    for path in same_text:
        flags = [a.replace(path, "<same text>") for a in flags]
    return tuple(flags)


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
    ids = _option(cudafe, "--module_id_file_name"), _option(cicc, "--module_id_file_name")
    if _GEN_MODULE_ID not in cudafe or len(ids[0]) != 1 or ids[0] != ids[1]:
        return None
    c_files, stubs = _option(cudafe, "--gen_c_file_name"), _option(cudafe, "--stub_file_name")
    if len(c_files) != 1 or len(stubs) != 1 or c_files[0] not in shlex.split(steps[6]):
        return None
    steps[1] = cudafe.replace(_GEN_MODULE_ID, "", 1)
    host_output = Path(c_files[0])
    return Phases(env, steps[0:2], steps[2:6], steps[6:7], Path(ids[0][0]), host_output, host_output.parent / stubs[0])


def _option(step: str, name: str) -> list[str]:
    """The values that follow ``name`` in a step's arguments."""
    argv = shlex.split(step)
    return [value for option, value in zip(argv, argv[1:], strict=False) if option == name]


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
