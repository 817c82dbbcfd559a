"""Run configurations that cannot work are refused when they are loaded or submitted, with the reason
on one line: never hours into a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import CoderRLConfig, ColdStartConfig, ConfigError, LoRAConfig, load_config
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
