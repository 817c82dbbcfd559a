"""Run configurations that cannot work are refused when they are loaded or submitted, with the reason
on one line: never hours into a run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from annotated_types import Le, Lt
from fastapi.testclient import TestClient
from pydantic import BaseModel, StrictInt
from pydantic.fields import FieldInfo

from services.config import Settings
from trainer.config import CoderRLConfig, ColdStartConfig, ConfigError, LoopConfig, LoRAConfig, ProposerRLConfig, load_config
from trainer.tiny_model import build_tiny_lm


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny"))


def test_a_yaml_file_and_overrides_make_a_typed_config(tmp_path: Path, model_dir: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(f"model_path: {model_dir}\ngroup_size: 4\nlora:\n  r: 8\nreward:\n  speed_score: speedup\n")
    config = load_config(CoderRLConfig, path, {"learning_rate": 3e-6, "groups_per_step": None})
    assert config.group_size == 4 and config.lora is not None and config.lora.r == 8
    assert config.learning_rate == 3e-6 and config.groups_per_step == 4  # None leaves the default
    assert config.reward.speed_score == "speedup"
    config.check(group_size_served=4)


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({"max_staleness": -1}, "max_staleness (K) must be 0 or more"),
        ({"group_size": 1}, "group_size: Input should be greater than or equal to 2"),
        ({"learning_rate": "fast"}, "learning_rate: Input should be a valid number"),
        ({"lora": {"rank": 8}}, "lora.rank: Extra inputs are not permitted"),
        ({"epsilon_low": 0.2, "epsilon_high": 0.01}, "epsilon_high below half of epsilon_low"),
    ],
)
def test_invalid_settings_are_refused_with_the_field_and_reason(
    model_dir: Path, settings: dict[str, object], reason: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(CoderRLConfig, None, {"model_path": model_dir, **settings})
    assert reason in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("steps", "reason"), [(0, "max_steps must be -1"), (-5, "greater than or equal to -1")])
def test_a_cold_start_that_would_not_stop_as_asked_is_refused(model_dir: Path, steps: int, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        load_config(ColdStartConfig, None, {"model_path": model_dir, "max_steps": steps})


def test_a_file_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("- model_path\n- group_size\n")
    with pytest.raises(ConfigError, match="holds a list, not a mapping"):
        load_config(ColdStartConfig, path, {})


def test_what_needs_the_model_is_checked_before_the_run(tmp_path: Path, model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="no config.json"):
        CoderRLConfig(model_path=tmp_path / "nowhere").check()
    with pytest.raises(ConfigError, match=r"target_modules \['qkv_proj'\] match no module"):
        ColdStartConfig(model_path=model_dir, lora=LoRAConfig(target_modules=["q_proj", "qkv_proj"])).check()
    with pytest.raises(ConfigError, match="group_size 8 does not match the groups being scored \\(4\\)"):
        CoderRLConfig(model_path=model_dir).check(group_size_served=4)
    CoderRLConfig(model_path=model_dir, lora=LoRAConfig(target_modules=["q_proj", "v_proj"])).check(group_size_served=8)
    ColdStartConfig(model_path=model_dir, lora=None).check()


def int_fields(model: type[BaseModel]) -> Iterator[tuple[str, FieldInfo]]:
    """Every integer field of a run configuration and of the configurations it holds, by its dotted name."""
    for name, info in model.model_fields.items():
        nested = [t for t in get_args(info.annotation) or [info.annotation] if isinstance(t, type) and issubclass(t, BaseModel)]
        for inner in nested:
            yield from ((f"{name}.{n}", i) for n, i in int_fields(inner))
        if int in get_args(info.annotation) or info.annotation in (int, StrictInt):
            yield name, info


@pytest.mark.parametrize("kind", [CoderRLConfig, ProposerRLConfig, ColdStartConfig, LoopConfig])
def test_every_count_of_a_run_has_an_upper_bound(kind: type[BaseModel]) -> None:
    """A count without one lets any key queue a run of millions of steps or a batch no device holds."""
    unbounded = [name for name, info in int_fields(kind) if not any(isinstance(m, Le | Lt) for m in info.metadata)]
    assert unbounded == []


@pytest.mark.parametrize(
    ("kind", "settings", "reason"),
    [
        (CoderRLConfig, {"warmup_steps": 100_001}, "warmup_steps: Input should be less than or equal to 100000"),
        (CoderRLConfig, {"groups_per_step": 1025}, "groups_per_step: Input should be less than or equal to 1024"),
        (CoderRLConfig, {"micro_batch_size": 4096}, "micro_batch_size: Input should be less than or equal to 1024"),
        (CoderRLConfig, {"max_staleness": 101}, "max_staleness: Input should be less than or equal to 100"),
        (CoderRLConfig, {"max_completion_tokens": 10**9}, "max_completion_tokens: Input should be less than or equal to 131072"),
        (ColdStartConfig, {"max_steps": 10**7}, "max_steps: Input should be less than or equal to 100000"),
        (
            ColdStartConfig,
            {"gradient_accumulation_steps": 1025},
            "gradient_accumulation_steps: Input should be less than or equal to 1024",
        ),
        (ColdStartConfig, {"epochs": 1e6}, "epochs: Input should be less than or equal to 1000"),
        (LoopConfig, {"coder_steps": 10_001}, "coder_steps: Input should be less than or equal to 10000"),
        (LoopConfig, {"tasks_per_round": 10**6}, "tasks_per_round: Input should be less than or equal to 10000"),
        (LoopConfig, {"coder": {"groups_per_step": 2000}}, "coder.groups_per_step: Input should be less than or equal to 1024"),
        (
            LoopConfig,
            {"coder_steps": 5000, "coder": {"groups_per_step": 8}},
            "40000 tasks per round (coder_steps 5000 x coder.groups_per_step 8) is over the bound of 10000",
        ),
    ],
)
def test_a_count_over_its_bound_is_refused_with_the_field_and_the_bound(
    model_dir: Path, kind: type[BaseModel], settings: dict[str, Any], reason: str
) -> None:
    overrides: dict[str, Any] = {"model_path": model_dir, **settings}
    if kind is LoopConfig:
        overrides = {**settings, "coder": {"model_path": str(model_dir), **settings.get("coder", {})}}
    with pytest.raises(ConfigError) as caught:
        load_config(kind, None, overrides)  # type: ignore[type-var]  # each of the run configurations
    assert reason in str(caught.value) and "\n" not in str(caught.value)


def test_the_trainer_api_refuses_a_run_over_a_bound_with_a_422_naming_it(kz_env: Callable[..., Settings], tmp_path: Path) -> None:
    kz_env(auth_enabled="false")
    from trainer.api import app

    with TestClient(app) as client:
        for config, field, bound in (
            ({"coder": {"model_path": str(tmp_path)}, "rounds": 10_001}, ["body", "rounds"], "10000"),
            ({"coder": {"model_path": str(tmp_path), "micro_batch_size": 10**6}}, ["body", "coder", "micro_batch_size"], "1024"),
        ):
            answer = client.post("/v1/runs", json=config)
            assert answer.status_code == 422, answer.text
            [error] = answer.json()["detail"]
            assert error["loc"] == field and f"less than or equal to {bound}" in error["msg"]
        answer = client.post("/v1/runs", json={"coder": {"model_path": str(tmp_path)}, "coder_steps": 10_000})
        assert answer.status_code == 422 and "40000 tasks per round" in answer.text
