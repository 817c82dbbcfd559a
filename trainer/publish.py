"""Weight publishing: what a training round produced becomes the version the Coder (or the Proposer)
serves.

The adapter (or, after a full fine-tune, the whole model) is written to the model store under the
next version's name, ``coder-v{N}`` (``proposer-v{N}``), first into a hidden directory and then renamed into place, so a
worker that loads it never reads half a checkpoint. Full weights are served by the ``hf`` backend;
with vLLM (the ``openai`` backend) publish an adapter, which it loads at runtime. The Coder service then records the version
(``model_versions``) and switches serving to it (``POST /v1/admin/model``); its workers load it at
their next job, so candidates generated afterwards carry the new version and jobs in flight finish on
theirs.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from services.db.models import ModelVersion
from services.schemas.serving import ModelSwitch, ServingModel

VERSION_DIR = re.compile(r"^(?P<role>[a-z]+)-v(?P<number>\d+)$")
# In a version's directory: what published it (a run's round, ``loop.claim_key``), written before the
# directory appears, so a round whose worker died after publishing finds its version instead of training again
ORIGIN_FILE = "published_by"

Write = Callable[[Path], object]  # writes the trained weights (and tokenizer) into the directory it is given


def next_version_name(store: Path, role: str) -> str:
    """``{role}-v{N}``, N one more than the highest in ``store`` (1 in an empty one)."""
    numbers = [
        int(match["number"])
        for path in (store.iterdir() if store.is_dir() else [])
        if (match := VERSION_DIR.match(path.name)) and match["role"] == role
    ]
    return f"{role}-v{max(numbers, default=0) + 1}"


def save_version(write: Write, store: Path, role: str, origin: str | None = None) -> Path:
    """Write the trained weights as the next version's directory, whole or not at all: into a staging
    directory of this call's own (removed if ``write`` fails), then under the first free number, the
    name reserved by an exclusive ``mkdir`` (two publishers never take one) and the staging directory
    renamed over that empty reservation. ``origin``: what published it (``ORIGIN_FILE``)."""
    store.mkdir(parents=True, exist_ok=True)
    staging = store / f".{role}-staging-{uuid.uuid4().hex}"
    try:
        write(staging)
        if origin is not None:
            (staging / ORIGIN_FILE).write_text(origin)
        while True:
            final = store / next_version_name(store, role)
            try:
                final.mkdir()
            except FileExistsError:  # another publisher took the number first
                continue
            staging.rename(final)  # over the empty directory just made: atomic on one file system
            return final
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def published_by(store: Path, role: str, origin: str) -> Path | None:
    """The version ``origin`` published, if it did (its worker may have died before recording it)."""
    for path in sorted(store.iterdir()) if store.is_dir() else []:
        match = VERSION_DIR.match(path.name)
        marker = path / ORIGIN_FILE
        if match and match["role"] == role and marker.is_file() and marker.read_text() == origin:
            return path
    return None


def publish_version(
    role: str,
    write: Write,
    store: Path,
    switch: Callable[[ModelSwitch], ServingModel],
    *,
    base_model: Path,
    adapter: bool,
    origin: str | None = None,
) -> ServingModel:
    """Save a role's new version (``write``: ``PolicyTrainer.save``, or an SFT run writing its result)
    and make it the one served. ``switch`` is that service's ``/v1/admin/model`` (the Coder's or the
    Proposer's client's ``switch_model``)."""
    return serve_version(save_version(write, store, role, origin), switch, base_model=base_model, adapter=adapter)


def serve_version(
    directory: Path, switch: Callable[[ModelSwitch], ServingModel], *, base_model: Path, adapter: bool
) -> ServingModel:
    """Make a saved version the one served (again, where it was: the service keeps one record per
    version). An adapter is served on ``base_model``; full weights are served as the base model itself."""
    if adapter:
        return switch(ModelSwitch(name=directory.name, base_model=str(base_model), adapter_path=str(directory)))
    return switch(ModelSwitch(name=directory.name, base_model=str(directory)))


def version_path(version: ServingModel | ModelVersion | None) -> Path | None:
    """The directory a published version was saved in (its adapter, or its whole model)."""
    if version is None:
        return None
    path = version.adapter_path or version.base_model
    return Path(path) if path else None


def served_weights(serving: ServingModel, *, adapter: bool) -> Path | None:
    """Where a run that has published nothing yet starts: the weights the role samples with (a
    cold-start adapter, or a published whole model), so the policy trained is the one sampled."""
    if adapter:
        return Path(serving.adapter_path) if serving.adapter_path else None
    if serving.id is not None and serving.adapter_path is None and serving.base_model:
        return Path(serving.base_model)
    return None
