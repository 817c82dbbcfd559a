"""The deployment files agree with the code: compose, Kubernetes, README, setup and CI scripts.

No Docker engine or cluster here, so these parse the files and check what drifts silently: module
paths, queue names, ports, KZ_ variable names, the settings table, the CI test command.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.cli.launcher import SERVICE_PACKAGES
from services.config import SERVICE_NAMES, Settings
from services.queue.names import service_queues

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
SETTING_VARS = {f"KZ_{name.upper()}" for name in Settings.model_fields}
DEFAULT_PORTS = {s: Settings.model_fields[f"{s}_port"].default for s in SERVICE_NAMES}


def option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def check_api_command(command: list[str], service: str) -> None:
    module, attr = command[command.index("uvicorn") + 1].split(":")
    assert (module, attr) == (f"{SERVICE_PACKAGES[service]}.api", "app")
    assert importlib.util.find_spec(module) is not None
    assert int(option(command, "--port")) == DEFAULT_PORTS[service]


def worker_queues(command: list[str], service: str) -> list[str]:
    module = option(command, "-A")
    assert module == f"{SERVICE_PACKAGES[service]}.worker" and importlib.util.find_spec(module) is not None
    return option(command, "-Q").split(",")


def k8s_documents() -> list[dict[str, Any]]:
    """The resources of k8s/base and the GPU worker of the gpu overlay (kustomize's own files are not
    resources; tests/test_deploy_files.py renders and validates every overlay)."""
    paths = sorted(p for p in (K8S / "base").glob("*.yaml") if p.name != "kustomization.yaml")
    paths.append(K8S / "overlays" / "gpu" / "reward-gpu-worker.yaml")
    return [doc for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]


def k8s_config() -> dict[str, str]:
    """The ConfigMap's KZ_ settings (base/config.env, which kustomize's generator turns into it)."""
    lines = (K8S / "base" / "config.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_compose_runs_every_service_and_worker_on_the_right_queues() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    expected = {"redis", "postgres", "migrate", "reward-gpu0-worker", "reward-gpu1-worker", "trainer-gpu-worker", "vllm"} | {
        f"{s}-{r}" for s in SERVICE_NAMES for r in ("api", "worker")
    }
    assert set(services) == expected
    assert services["migrate"]["command"] == ["kernelzero", "db", "upgrade"]
    for service in SERVICE_NAMES:
        api = services[f"{service}-api"]
        check_api_command(api["command"], service)
        assert api["ports"] == [f"{DEFAULT_PORTS[service]}:{DEFAULT_PORTS[service]}"]
        assert api["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
        assert f":{DEFAULT_PORTS[service]}/readyz" in " ".join(api["healthcheck"]["test"])
        queues = worker_queues(services[f"{service}-worker"]["command"], service)
        assert queues == service_queues(service, []), service
    gpu = services["reward-gpu0-worker"]
    assert worker_queues(gpu["command"], "reward") == service_queues("reward", [0])
    # one process per GPU; its groups run in threads sharing the warm children (timing stays exclusive)
    assert option(gpu["command"], "--pool") == "threads"
    assert option(gpu["command"], "-c") == "${KZ_REWARD_GPU_CONCURRENCY:-4}"
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    # trial tensors (GBs) cross between children in memory, not on the container's disk
    assert any(t.startswith(gpu["environment"]["KZ_REWARD_SCRATCH_DIR"] + ":") for t in gpu["tmpfs"])
    # Every KZ_ variable is a setting (or KZ_SANDBOX, which the sandbox reads); the rest are the images' own.
    others = {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB", "REDIS_PASSWORD", "REDISCLI_AUTH", "PROMETHEUS_MULTIPROC_DIR"}
    others |= {"VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_API_KEY", "HF_TOKEN"}
    for name, service in services.items():
        assert set(service.get("environment", {})) - others <= SETTING_VARS | {"KZ_SANDBOX"}, name


def test_kubernetes_manifests_are_complete_and_consistent() -> None:
    docs = k8s_documents()
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), doc
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    assert set(by_kind["Namespace"]) == {"kernelzero"}
    assert set(k8s_config()) <= SETTING_VARS

    deployments = by_kind["Deployment"]
    for service in SERVICE_NAMES:
        api = deployments[f"{service}-api"]["spec"]
        assert api["selector"]["matchLabels"] == api["template"]["metadata"]["labels"]
        container = api["template"]["spec"]["containers"][0]
        check_api_command(container["command"], service)
        assert container["ports"] == [{"name": "http", "containerPort": DEFAULT_PORTS[service]}]
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        svc = by_kind["Service"][f"{service}-api"]["spec"]
        assert svc["selector"] == api["selector"]["matchLabels"]
        assert svc["ports"][0]["targetPort"] == "http"
        worker = deployments[f"{service}-worker"]["spec"]["template"]["spec"]["containers"][0]
        assert worker_queues(worker["command"], service) == service_queues(service, [])
        for container in (c for d in deployments.values() for c in d["spec"]["template"]["spec"]["containers"]):
            assert {e["name"] for e in container.get("env", [])} - {
                "PROMETHEUS_MULTIPROC_DIR",
                "REDIS_PASSWORD",
                "REDISCLI_AUTH",
            } <= SETTING_VARS | {"KZ_SANDBOX"}
    gpu = deployments["reward-gpu-worker"]["spec"]["template"]["spec"]["containers"][0]
    assert worker_queues(gpu["command"], "reward") == ["score.gpu0"]
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert option(gpu["command"], "--pool") == "threads" and int(option(gpu["command"], "-c")) >= 1
    scratch = next(e["value"] for e in gpu["env"] if e["name"] == "KZ_REWARD_SCRATCH_DIR")
    gpu_pod = deployments["reward-gpu-worker"]["spec"]["template"]["spec"]
    mount = next(m for m in gpu["volumeMounts"] if m["mountPath"] == scratch)
    assert next(v for v in gpu_pod["volumes"] if v["name"] == mount["name"])["emptyDir"]["medium"] == "Memory"


def test_up_runs_a_gpu_reward_worker_with_threads_and_the_rest_with_one_process() -> None:
    from services.cli.launcher import platform_commands
    from services.config import Settings

    def worker(settings: Settings, service: str) -> list[str]:
        return next(p.command for p in platform_commands(settings, (service,)) if p.name.endswith("worker"))

    gpu = Settings(gpu_devices=[0], reward_gpu_concurrency=3)
    assert option(worker(gpu, "reward"), "--pool") == "threads" and option(worker(gpu, "reward"), "-c") == "3"
    for settings, service in ((Settings(gpu_devices=[]), "reward"), (gpu, "coder")):
        command = worker(settings, service)
        assert "--pool" not in command and option(command, "-c") == "1"

    base = K8S / "base"
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in base.glob("*.yaml") if p.name != "kustomization.yaml")


def readme_quickstart() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", section, re.S)
    assert block is not None, "README's quickstart has no code block"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_readme_quickstart_is_two_commands_and_ci_runs_the_second() -> None:
    setup_and_up, run_tests = readme_quickstart()
    assert setup_and_up == "./scripts/setup.sh && .venv/bin/kernelzero up"
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert any(line == run_tests or line.startswith(run_tests + " ") for line in ci_lines), run_tests


def test_readme_documents_every_setting() -> None:
    readme = (ROOT / "README.md").read_text()
    documented = set(re.findall(r"^\| `(KZ_[A-Z0-9_]+)` \|", readme, re.M))
    assert documented == SETTING_VARS


@pytest.mark.parametrize("script", ["scripts/setup.sh", ".ci/run"])
def test_scripts_are_executable_bash(script: str) -> None:
    path = ROOT / script
    assert os.access(path, os.X_OK)
    assert path.read_text().startswith("#!/usr/bin/env bash\n")
    check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_the_image_copies_every_package_the_distribution_installs() -> None:
    """A package left out of an image's Dockerfile installs nothing and fails at its first import there."""
    import tomllib

    included = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in included}
    for dockerfile in ("Dockerfile", "Dockerfile.cuda"):
        copied = set(re.findall(r"^COPY (\w+) \./\1$", (ROOT / "docker" / dockerfile).read_text(), re.M))
        assert packages <= copied, (dockerfile, sorted(packages - copied))
