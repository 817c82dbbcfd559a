"""The one settings object of the platform (environment prefix ``KZ_``, ``.env`` honoured)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr, computed_field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

SERVICE_NAMES = ("proposer", "coder", "reward", "trainer")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KZ_", env_file=".env", extra="ignore")

    data_dir: Path = Field(default=Path.home() / ".kernelzero", description="Embedded state: SQLite, caches, run files.")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; SQLite in data_dir when unset.")
    redis_url: str = "redis://127.0.0.1:6379/0"

    auth_enabled: bool = Field(default=True, description="Deployments keep this on; local mode may turn it off.")
    api_key: SecretStr | None = Field(default=None, description="Key the HTTP clients send; else read from data_dir/api-key.")
    host: str = "127.0.0.1"
    proposer_port: int = 8101
    coder_port: int = 8102
    reward_port: int = 8103
    trainer_port: int = 8104
    log_level: str = "INFO"
    log_json: bool = True

    # Celery reliability: a GPU job may run long; the broker must not redeliver a live job.
    task_soft_time_limit_s: int = 1800
    task_hard_time_limit_s: int = 2000
    visibility_timeout_s: int = 2400
    max_job_attempts: int = 3
    gpu_devices: list[int] = Field(default_factory=list, description="GPU indices with one scoring queue each.")

    # Reward service
    sandbox_memory_bytes: int = Field(default=16 << 30, description="Address-space limit of a CPU evaluation child.")
    reward_warm_children: int = Field(default=1, ge=0, description="Evaluation children kept warm per worker.")
    reward_parallel_children: int = Field(default=2, ge=1, description="Candidates of one group evaluated at once.")

    @model_validator(mode="after")
    def _visibility_outlives_jobs(self) -> "Settings":
        # Redis redelivers an unacked message after the visibility timeout: it must exceed the
        # hard limit, or a long GPU job would run twice.
        if self.visibility_timeout_s <= self.task_hard_time_limit_s:
            raise ValueError("KZ_VISIBILITY_TIMEOUT_S must exceed KZ_TASK_HARD_TIME_LIMIT_S")
        if self.task_soft_time_limit_s >= self.task_hard_time_limit_s:
            raise ValueError("KZ_TASK_SOFT_TIME_LIMIT_S must be below KZ_TASK_HARD_TIME_LIMIT_S")
        return self

    @computed_field  # type: ignore[prop-decorator]
    @property
    def sqlalchemy_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'kernelzero.db'}"

    @property
    def api_key_file(self) -> Path:
        """Where ``kernelzero up`` leaves this machine's key and the HTTP clients look for it."""
        return self.data_dir / "api-key"

    def service_port(self, service: str) -> int:
        return int(getattr(self, f"{service}_port"))

    def service_url(self, service: str) -> str:
        return f"http://{self.host}:{self.service_port(service)}"


@lru_cache
def get_settings() -> Settings:
    settings = Settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    return settings
