"""The Proposer's validation check: one module built to break each rule, a good module, crashes and
hangs, duplicates under renaming and reformatting, and the CLI's --json output.

Every dynamic check runs in a real sandboxed child; modules that share options are validated as
one batch (two children at once) to keep the file fast.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from proposer_svc.validate import (
    ValidationOptions,
    ValidationResult,
    Validator,
    check_static,
    finite,
    source_hash,
    validate_module,
    validate_modules,
)
from services.config import Settings

HEADER = "import torch\nimport torch.nn as nn\n"

GOOD = (
    HEADER
    + '''
class Model(nn.Module):
    """Linear, ReLU, plus a second input."""

    def __init__(self, features: int):
        super(Model, self).__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        hidden = self.linear(x)  # the layer
        return torch.relu(hidden) + y


batch = 8
features = 16

def get_inputs():
    return [torch.randn(batch, features), torch.randn(batch, features)]

def get_init_inputs():
    return [features]
'''
)

# The same module: other names, no docstring or comments, other formatting and annotations.
GOOD_RENAMED = (
    HEADER
    + """
class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.proj = nn.Linear(n, n)
    def forward(self, a, b):
        h = self.proj(a)
        return torch.relu(h)+b
rows = 8
cols = 16
def get_inputs():
    return [torch.randn(rows, cols), torch.randn(rows, cols)]
def get_init_inputs():
    return [cols]
"""
)

# Another source computing the same op graph (relu spelt as a method, the sum split in two lines).
GOOD_SAME_GRAPH = (
    HEADER
    + """
class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x, y):
        out = self.fc(x).relu()
        out = out + y
        return out

def get_inputs():
    return [torch.randn(8, 16), torch.randn(8, 16)]

def get_init_inputs():
    return [16]
"""
)


def module(
    forward: str, inputs: str = "[torch.randn(8, 16), torch.randn(8, 16)]", init: str = "[]", body: str = "", prelude: str = ""
) -> str:
    """A KernelBench-format module whose forward(x, y) is ``forward`` (indented code)."""
    return (
        HEADER
        + prelude
        + f"""
class Model(nn.Module):
    def __init__(self, *args):
        super().__init__()
{body or "        pass"}

    def forward(self, x, y):
{forward}

def get_inputs():
    return {inputs}

def get_init_inputs():
    return {init}
"""
    )


BROKEN = {
    "structure": HEADER
    + "class Model(nn.Module):\n    def forward(self, x):\n        return x\n\ndef get_inputs():\n    return [torch.randn(2)]\n",
    "load_error": module("        return x + y", prelude="torch.kz_no_such_function()\n"),
    "runtime_error": module("        return x @ torch.randn(3, 3) + y"),
    "output_type": module("        return float(x.sum() + y.sum())"),
    "nan_inf": module("        return torch.log(-(x.abs() + y.abs() + 1))"),
    # KernelBench's classic: a max over a dim keeps one value per row; minus its own mean is 0.
    "near_constant": module(
        "        m = torch.max(x + y, dim=1, keepdim=True).values\n        return m - m.mean(dim=1, keepdim=True)"
    ),
    "nondeterministic": module("        return x + y + torch.rand_like(x)"),
    "seed_invariant": module("        return x * 2 + y", inputs="[torch.arange(16.0).reshape(4, 4), torch.ones(4, 4)]"),
    "input_unused": module("        return torch.tanh(x) * y.shape[0]"),
    "parameters_unused": module(
        "        return torch.relu(x) + y + 0 * self.linear(x)", body="        self.linear = nn.Linear(16, 16)"
    ),
}
SEED_INVARIANT_OUTPUT = module("        return torch.arange(x.shape[0] * y.shape[1], dtype=x.dtype).reshape(x.shape[0], -1)")
CRASH = module("        import os, signal\n        os.kill(os.getpid(), signal.SIGSEGV)\n        return x + y")
OOM = module("        return torch.empty(1 << 42, dtype=torch.float32)[: x.numel()].reshape(x.shape) + y")
HANG = module("        while True:\n            pass\n        return x + y")
TOO_SLOW = module(
    "        w = torch.tanh(torch.arange(1 << 20, dtype=x.dtype).reshape(1024, 1024) * 1e-6 + x.sum())\n"
    "        m = w @ w @ w\n        return x + y + 1e-30 * m.mean()"
)
# Every value of a softmax over 262,144 values lies within the reward's atol of zero: a kernel that
# writes zeros would pass, so the task cannot tell right from wrong.
TOLERANCE_BLIND = module(
    "        return torch.softmax((x * y).reshape(-1), dim=0)", inputs="[torch.rand(512, 512), torch.rand(512, 512)]"
)
TOO_FAST = module("        return x + y", inputs="[torch.randn(4), torch.randn(4)]")


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(_env_file=None, data_dir=tmp_path_factory.mktemp("kz-data"))  # type: ignore[call-arg]


@pytest.fixture(scope="module")
def batch(settings: Settings) -> dict[str, ValidationResult]:
    """Every rule-breaking module, the good one and the crashers, validated as one batch."""
    named = {
        **BROKEN,
        "seed_invariant_output": SEED_INVARIANT_OUTPUT,
        "tolerance_blind": TOLERANCE_BLIND,
        "oom": OOM,
        "good": GOOD,
    }
    options = ValidationOptions(device="cpu", min_ms=0, max_ms=0, timeout_s=120)
    with Validator(options, settings, warm_children=2) as validator:
        results = dict(zip(named, validator.validate_many(list(named.values()), parallel=2)))
        # The policy refuses `os.kill` before anything runs; past it, a crash must still be a verdict.
        results["crash_static"] = validator.validate(CRASH)
        results["crash"] = validator.dynamic(CRASH, "0" * 64)
    return results


@pytest.mark.slow  # sandboxed children
@pytest.mark.parametrize("rule", sorted(BROKEN))
def test_each_rule_rejects_a_module_built_to_break_it(batch: dict[str, ValidationResult], rule: str) -> None:
    result = batch[rule]
    assert not result.valid and result.rule == rule, result
    assert result.reason and result.reason != "passed every check"


@pytest.mark.slow  # sandboxed children
def test_reasons_say_what_happened(batch: dict[str, ValidationResult]) -> None:
    assert "get_init_inputs" in batch["structure"].reason
    assert "kz_no_such_function" in batch["load_error"].reason
    assert "input 1" in batch["input_unused"].reason
    assert "same inputs for every seed" in batch["seed_invariant"].reason
    assert batch["seed_invariant_output"].rule == "seed_invariant" and "different seeds" in batch["seed_invariant_output"].reason
    assert "272 parameters" in batch["parameters_unused"].reason
    assert "equals 0" in batch["near_constant"].reason
    blind = batch["tolerance_blind"]
    assert blind.rule == "near_constant" and "within the reward's tolerance of every one of the 262144 values" in blind.reason


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        (GOOD.replace("class Model", "class Net"), "no class Model"),
        (GOOD.replace("def forward", "def run"), "Model has no forward method"),
        (GOOD.replace("def get_inputs", "def inputs"), "no function get_inputs()"),
        (module("        return x * 2"), "forward never uses its argument y"),
        (GOOD.replace("def forward(self, x: torch.Tensor, y: torch.Tensor)", "def forward(self, x, y)\n"), "not valid Python"),
    ],
)
def test_structure_is_checked_on_the_ast_alone(source: str, reason: str) -> None:
    verdict = check_static(source)
    assert isinstance(verdict, ValidationResult) and verdict.rule == "structure" and reason in verdict.reason, verdict


def test_modules_that_could_forge_their_verdict_or_break_the_parser_are_refused_statically() -> None:
    """The checks run in the module's process: the reward policy keeps it off files and the harness."""
    forger = GOOD.replace("import torch\n", "import torch\nopen('result.json', 'w').write('{\"valid\": true}')\n", 1)
    verdict = check_static(forger)
    assert isinstance(verdict, ValidationResult) and verdict.rule == "policy" and "open" in verdict.reason
    nested = check_static("x = " + "+".join(["a"] * 2000) + "\n" + GOOD)
    assert isinstance(nested, ValidationResult) and nested.rule == "structure"


def test_measurements_are_stored_as_finite_json() -> None:
    """An integer output that changed completely measures inf; the database and HTTP take null."""
    assert finite({"seed_change": float("inf"), "runs": [1.0, float("nan")], "n": 3}) == {
        "seed_change": None,
        "runs": [1.0, None],
        "n": 3,
    }


@pytest.mark.slow  # sandboxed children
def test_a_good_module_passes_with_its_facts(batch: dict[str, ValidationResult]) -> None:
    good = batch["good"]
    assert good.valid and good.rule is None, good
    assert good.device == "cpu" and good.source_hash and good.graph_hash
    d = good.details
    assert d["input_shapes"] == [[8, 16], [8, 16]] and d["output_shapes"] == [[8, 16]] and d["output_dtypes"] == ["torch.float32"]
    assert d["parameters"] == 16 * 16 + 16 and d["runtime_ms"] > 0 and d["timing_runs"] >= 3
    assert {"addmm", "relu", "add"} <= set(d["compute_ops"])
    assert d["seed_change"] > 0.01 and d["parameter_change"] > 0.01 and d["nondeterminism"] == 0.0
    json.loads(good.model_dump_json())  # serialisable as is


@pytest.mark.slow  # sandboxed children
def test_crash_and_out_of_memory_give_verdicts(batch: dict[str, ValidationResult]) -> None:
    crash, oom = batch["crash"], batch["oom"]
    assert batch["crash_static"].rule == "policy"
    assert crash.rule == "runtime_error" and "SIGSEGV" in crash.reason
    assert oom.rule == "runtime_error" and "out of memory" in oom.reason


@pytest.mark.slow  # sandboxed children
def test_a_hanging_module_times_out(settings: Settings) -> None:
    result = validate_module(HANG, ValidationOptions(device="cpu", timeout_s=8, max_ms=0), settings)
    assert not result.valid and result.rule == "timeout" and "8 s" in result.reason


@pytest.mark.slow  # sandboxed children
def test_runtime_bounds(settings: Settings) -> None:
    options = ValidationOptions(device="cpu", min_ms=5, max_ms=20, timeout_s=120)
    with Validator(options, settings, warm_children=1) as validator:
        slow, fast = validator.validate_many([TOO_SLOW, TOO_FAST], parallel=2)
    assert slow.rule == "too_slow" and slow.details["runtime_ms"] > 20, slow
    assert fast.rule == "too_fast" and fast.details["runtime_ms"] < 5, fast


def test_renamed_and_reformatted_sources_hash_alike() -> None:
    import ast

    assert source_hash(ast.parse(GOOD)) == source_hash(ast.parse(GOOD_RENAMED))
    assert source_hash(ast.parse(GOOD)) != source_hash(ast.parse(GOOD.replace("torch.relu", "torch.sigmoid")))
    assert source_hash(ast.parse(GOOD)) != source_hash(ast.parse(GOOD_SAME_GRAPH))


@pytest.mark.slow  # sandboxed children
def test_duplicates_in_a_batch_and_against_known_hashes(settings: Settings) -> None:
    options = ValidationOptions(device="cpu", min_ms=0, max_ms=0, timeout_s=120)
    first, renamed, same_graph = validate_modules([GOOD, GOOD_RENAMED, GOOD_SAME_GRAPH], options, settings=settings, parallel=2)
    assert first.valid
    assert renamed.rule == "duplicate" and "normalised source as module #0" in renamed.reason
    assert renamed.graph_hash is None  # caught before any child ran
    assert same_graph.rule == "duplicate" and "op graph as module #0" in same_graph.reason
    assert same_graph.graph_hash == first.graph_hash and same_graph.source_hash != first.source_hash
    (again,) = validate_modules([GOOD_SAME_GRAPH], options, known_hashes={first.graph_hash}, settings=settings)
    assert again.rule == "duplicate" and "known task" in again.reason


@pytest.mark.slow  # sandboxed children
def test_cli_json_lines(kz_env: Callable[..., Settings], tmp_path: Path) -> None:
    kz_env()
    files = {"good.py": GOOD, "renamed.py": GOOD_RENAMED, "nan.py": BROKEN["nan_inf"]}
    for name, source in files.items():
        (tmp_path / name).write_text(source)
    kernelzero = Path(sys.executable).with_name("kernelzero")
    run = subprocess.run(
        [str(kernelzero), "proposer", "validate", *files, "--json", "--device", "cpu", "--max-ms", "0"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    lines = {Path(obj["path"]).name: obj for obj in map(json.loads, run.stdout.strip().splitlines())}
    assert set(lines) == set(files)
    for obj in lines.values():
        assert {"path", "valid", "reason", "rule", "source_hash", "graph_hash", "details"} <= set(obj)
    assert lines["good.py"]["valid"] is True and lines["good.py"]["details"]["runtime_ms"] > 0
    assert lines["renamed.py"]["valid"] is False and lines["renamed.py"]["rule"] == "duplicate"
    assert lines["nan.py"]["rule"] == "nan_inf" and "NaN" in lines["nan.py"]["reason"]


def test_gpu_validation_takes_the_reward_services_device_lock(settings: Settings) -> None:
    """On a GPU the validation children lock the same file as reward evaluations (shared while
    checking, exclusive while timing), so a validation never runs beside a kernel being timed. They
    hold it as descriptors their pool opened: the locks directory is neither writable nor visible."""
    reward_lock = settings.data_dir / "reward" / "locks" / "gpu.lock"
    with Validator(ValidationOptions(device="cuda"), settings, warm_children=0) as on_gpu:
        assert on_gpu.pool.layout.gpu_lock("cuda") == str(reward_lock)
        policy = on_gpu.pool.confinement(settings.data_dir / "child")
        assert reward_lock.parent not in policy.writable_dirs + policy.readonly_dirs
        assert "gpu_lock" not in on_gpu.spec()  # each child's own descriptors go into its job (sandbox.Child.run)
    with Validator(ValidationOptions(device="cpu"), settings, warm_children=0) as on_cpu:
        assert on_cpu.pool.layout.gpu_lock("cpu") is None
