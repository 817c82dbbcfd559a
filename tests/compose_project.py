"""A copy of the compose project for the container tests (``tests/test_container_*.py``): the compose
file with the images under test, the seccomp profile, an .env with test passwords, driven through the
Compose CLI the dev extra installs. ``KZ_TEST_IMAGE`` names the CPU image; where the registry is out of
reach, ``KZ_TEST_REDIS_IMAGE`` / ``KZ_TEST_POSTGRES_IMAGE`` name local images that behave as the pinned
ones (benchmarks/results/deploy/NOTES.md says how the recorded runs made them)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMAGE = os.environ.get("KZ_TEST_IMAGE", "")
SECRETS = {"POSTGRES_PASSWORD": "container-test-pg", "REDIS_PASSWORD": "container-test-redis"}
SUBSTITUTES = {  # the compose file's image: the variable that may name a local stand-in
    "kernelzero:0.1.0": "KZ_TEST_IMAGE",
    "redis:7.4.2-bookworm": "KZ_TEST_REDIS_IMAGE",
    "postgres:16.6-bookworm": "KZ_TEST_POSTGRES_IMAGE",
}


def engine_answers() -> bool:
    docker = shutil.which("docker")
    try:
        return bool(docker) and subprocess.run([docker or "docker", "info"], capture_output=True, timeout=30).returncode == 0
    except subprocess.TimeoutExpired:  # a daemon that hangs is no engine to test with: a skip, not a collection error
        return False


needs_engine_and_image = pytest.mark.skipif(
    not IMAGE or not engine_answers(), reason="needs a Docker engine and KZ_TEST_IMAGE (a built image)"
)


class ComposeProject:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        text = (ROOT / "docker-compose.yml").read_text()
        for image, variable in SUBSTITUTES.items():
            text = text.replace(f"image: {image}\n", f"image: {os.environ.get(variable) or image}\n")
        (directory / "docker-compose.yml").write_text(text)
        shutil.copytree(ROOT / "docker", directory / "docker")
        (directory / ".env").write_text("".join(f"{k}={v}\n" for k, v in SECRETS.items()))

    def __call__(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        command = [
            str(ROOT / ".venv" / "bin" / "docker-compose"),
            "--project-directory",
            str(self.directory),
            "-f",
            "docker-compose.yml",
        ]
        done = subprocess.run([*command, *args], cwd=self.directory, capture_output=True, text=True, timeout=timeout)
        if check:
            assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        return done

    def run(self, service: str, *command: str, volumes: tuple[str, ...] = ()) -> str:
        """``command`` in a one-off container of ``service`` as compose defines it (no dependencies)."""
        mounts = [arg for volume in volumes for arg in ("-v", volume)]
        return self("run", "--rm", "--no-deps", "--pull", "never", "-T", *mounts, service, *command).stdout

    def down(self) -> None:
        self("down", "--volumes", "--remove-orphans", check=False)
