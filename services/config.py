"""The one settings object of the platform (environment prefix ``KZ_``, ``.env`` honoured)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, computed_field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

SERVICE_NAMES = ("proposer", "coder", "reward", "trainer")


class ConfigurationError(ValueError):
    """A setting or configuration that cannot work: the message says why in one line, and the
    ``kernelzero`` command prints just that and exits 1 (no traceback)."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KZ_", env_file=".env", extra="ignore")

    data_dir: Path = Field(default=Path.home() / ".kernelzero", description="Embedded state: SQLite, caches, run files.")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; SQLite in data_dir when unset.")
    redis_url: str = "redis://127.0.0.1:6379/0"

    auth_enabled: bool = Field(default=True, description="Deployments keep this on; local mode may turn it off.")
    api_key: SecretStr | None = Field(default=None, description="Key the HTTP clients send; else read from data_dir/api-key.")
    host: str = "127.0.0.1"
    max_request_bytes: int = Field(
        default=64 << 20,
        ge=0,
        description="Largest request body a service reads; a larger one is answered 413 before it is read. The largest "
        "real body is a scoring group: 64 candidates and a reference of up to 200,000 characters each, which JSON "
        "escapes can make 5 bytes a character.",
    )
    quota_window_s: float = Field(
        default=3600.0, gt=0, description="The quotas' period: each key's bucket refills its whole quota over this time."
    )
    quota_proposed_modules: int = Field(
        default=5000, ge=0, description="Modules (count x group_size) one key may have proposed per window; 0: no limit."
    )
    quota_kernel_candidates: int = Field(
        default=20000, ge=0, description="Kernel candidates (n) one key may have generated per window; 0: no limit."
    )
    quota_scored_candidates: int = Field(
        default=20000, ge=0, description="Candidates one key may have scored per window; 0: no limit."
    )
    proposer_port: int = 8101
    coder_port: int = 8102
    reward_port: int = 8103
    trainer_port: int = 8104
    log_level: str = "INFO"
    log_json: bool = True
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Port of a worker's Prometheus /metrics server (deployments set it); unset: the worker opens no port. "
        "The APIs serve /metrics on their own port.",
    )

    # kernelzero up: a process that dies once the platform is up is started again after a backoff; one that keeps
    # dying is a crash loop, which a restart will not mend, so `up` stops with the reason instead of spinning.
    restart_limit: int = Field(
        default=5,
        ge=0,
        description="Restarts of one process `kernelzero up` makes within restart_window_s; its next death is a crash loop, "
        "which stops the platform with the reason (0: never restart).",
    )
    restart_window_s: float = Field(default=300.0, gt=0, description="The window the restart limit counts in.")
    restart_backoff_s: float = Field(
        default=1.0,
        ge=0,
        description="Wait before restarting a dead process; doubled for each restart of it within the window, up to 60 s.",
    )

    # Celery reliability: a GPU job may run long; the broker must not redeliver a live job.
    task_soft_time_limit_s: int = 1800
    task_hard_time_limit_s: int = 2000
    visibility_timeout_s: int = 2400
    max_job_attempts: int = Field(
        default=3, ge=1, description="Deliveries a job gets (runs its worker died in, messages the broker lost) before it fails."
    )
    # Recovery without the visibility timeout: the process running a job beats on its row; a sweeper in
    # every worker sends again what a dead worker held or what the broker lost (services/queue/sweeper.py).
    worker_heartbeat_s: float = Field(
        default=5.0, gt=0, description="How often the process running a job records on its row that it is alive."
    )
    worker_dead_after_s: float = Field(
        default=30.0,
        gt=0,
        description="A running job not heard from for this long has lost its worker: it is sent again (or failed past "
        "max_job_attempts). On the worker's own host a process that is gone counts as dead at once.",
    )
    queued_grace_s: float = Field(
        default=60.0,
        gt=0,
        description="A job queued this long whose message the broker no longer holds (Redis restarted without its data, "
        "a sender that died before sending) is sent again.",
    )
    sweep_interval_s: float = Field(
        default=10.0, gt=0, description="How often the workers look for such jobs; one sweep per interval across them all."
    )
    database_retry_s: float = Field(
        default=300.0,
        ge=0,
        description="How long a worker's job bookkeeping and job body wait for a database that is away (a connection "
        "refused or cut) before the error stands; an API request never waits: it answers 503.",
    )
    gpu_devices: list[int] = Field(default_factory=list, description="GPU indices with one scoring queue each.")

    # Reward service
    sandbox_memory_bytes: int = Field(default=16 << 30, description="Address-space limit of a CPU evaluation child.")
    reward_warm_children: int | None = Field(
        default=None,
        ge=0,
        description="Evaluation children kept warm per worker; unset: 1 on CPU, on a GPU host min(8, CPU cores / 2) "
        "(each evaluation takes two, and a child needs seconds to warm up).",
    )
    reward_max_file_bytes: int = Field(
        default=32 << 30,
        gt=0,
        description="Largest file an evaluation child may write: its inputs and outputs cross as files, and KernelBench "
        "level-1 tensors reach 6.4 GB.",
    )
    reward_exchange_max_bytes: int | None = Field(
        default=None,
        gt=0,
        description="Trial tensors crossing between children as files: per reference (it runs fewer correctness cases when "
        "they would pass it, but at least two), across groups (a new reference waits while the files in use pass it) and "
        "across the candidates whose outputs are being written at once (a larger one runs alone); unset: a quarter of the "
        "scratch filesystem. A KernelBench level-1 case is 13 GB of input and output.",
    )
    reward_device_memory_max_bytes: int | None = Field(
        default=None,
        gt=0,
        description="Device memory a GPU worker's children reserve together: a candidate what its reference peaked at plus "
        "its harness's copies, a reference its largest peak plus a context (an eighth of this before it first ran), and "
        "each waits while the others' reservations would pass this (a larger one runs alone, after a drain); unset: nine "
        "tenths of the GPU's memory less a GiB for each warm child (an idle child holds a CUDA context no reservation "
        "counts).",
    )
    reward_scratch_min_free_bytes: int = Field(
        default=1 << 30,
        ge=0,
        description="Free space a reference leaves in the scratch filesystem: one whose trial tensors would take it below "
        "this stops, and its group waits for other groups' files to go, then runs again (groups admitted together can "
        "each fit the exchange budget and still not fit the filesystem together).",
    )
    reward_scratch_dir: Path | None = Field(
        default=None,
        description="Evaluation children's work directories and the trial tensors they exchange; unset: <data dir>/reward. "
        "On a GPU host point it at a tmpfs (/dev/shm, a memory-backed volume): every trial's tensors are written and read "
        "once, and on a disk GB-sized ones cost seconds each.",
    )
    reward_parallel_children: int = Field(
        default=2,
        ge=1,
        description="Evaluation children per group a worker process runs at once: its slots are this times "
        "reward_gpu_concurrency on a GPU worker (gpu_devices set), this elsewhere, or this times the groups in flight where "
        "more run; shared by its groups' references and candidates, each free one going to the group running fewest, so "
        "under load the groups share them evenly and a group alone may use them all.",
    )
    reward_outputs_in_flight: int = Field(
        default=1,
        ge=1,
        le=8,
        description="A candidate's published output files not yet judged before its harness waits for the judge, and how "
        "many of them the judge compares at once: more lets a candidate run ahead of a busy judge and overlaps one output's "
        "copy with another's wait for the device, and reserves one more output's bytes of the exchange budget and two of "
        "device memory each.",
    )
    reward_device_exchange: bool = Field(
        default=True,
        description="On a GPU, a candidate's outputs of reward_device_exchange_min_bytes or more go from its child to the "
        "judge as descriptors of device memory (services/children/device_exchange.py) instead of files through the host; "
        "off, every output is a file (the way back should the exchange misbehave on a driver; "
        "benchmarks/results/reward_throughput_h200/NOTES.md has its A/B).",
    )
    reward_device_exchange_min_bytes: int = Field(
        default=64 << 20,
        ge=0,
        description="With reward_device_exchange, the smallest output sent as device memory, and judged on the device; "
        "smaller outputs are files, judged on the host up to 64 MiB. 0 sends every output (the GPU tests run the hack "
        "cases through the exchange so).",
    )
    reward_cache_max_bytes: int = Field(
        default=20 << 30,
        gt=0,
        description="Cap on published candidate builds; least recently used go first (never one used in the last hour).",
    )
    reward_gpu_concurrency: int = Field(
        default=4,
        ge=1,
        description="Groups a GPU reward worker evaluates at once (Celery threads pool): compiles and correctness trials "
        "overlap, while timing stays exclusive through the device lock.",
    )

    # Proposer service
    proposer_corpus: str = Field(default="default", description="Mined API statistics the proposer samples from.")
    proposer_composer: Literal["composer", "llm"] = Field(
        default="composer", description="Who writes modules: the programmatic composer or the LLM."
    )
    proposer_sample_temperature: float = Field(
        default=1.0, gt=0, description="Temperature of API-set sampling (higher: flatter)."
    )
    proposer_failure_bias: float = Field(default=1.0, ge=0, description="Weight toward APIs the Coder fails on (0: none).")
    proposer_api_set_size: int = Field(default=3, ge=1, description="APIs sampled per proposed module.")
    proposer_frontier_shape: Literal["linear", "gaussian"] = Field(
        default="linear", description="Frontier reward: 1-|2p-1|, or a gaussian around 0.5."
    )
    proposer_frontier_width: float = Field(default=0.2, gt=0, description="Standard deviation of the gaussian frontier reward.")
    proposer_min_attempts: int = Field(default=4, ge=1, description="Scored candidates before a task's pass rate counts.")
    proposer_explore_fraction: float = Field(
        default=0.25, ge=0, le=1, description="Share of a round's tasks given to under-attempted ones."
    )
    proposer_validation_timeout_s: float = Field(
        default=120.0, gt=0, description="Wall-clock limit of one module's validation child."
    )
    proposer_validation_warm_children: int = Field(
        default=1, ge=0, description="Validation children kept warm while a batch runs."
    )
    proposer_min_ms_cpu: float = Field(default=0.0, ge=0, description="Runtime lower bound of a module on CPU (0: none).")
    proposer_max_ms_cpu: float = Field(default=10000.0, ge=0, description="Runtime upper bound of a module on CPU (0: none).")
    proposer_min_ms_cuda: float = Field(default=0.005, ge=0, description="Runtime lower bound of a module on the GPU (0: none).")
    proposer_max_ms_cuda: float = Field(default=1000.0, ge=0, description="Runtime upper bound of a module on the GPU (0: none).")

    # Coder service
    coder_model_backend: Literal["template", "openai", "hf"] = Field(
        default="template",
        description="Kernel generator: the deterministic template, an OpenAI-compatible endpoint, or a local HF model.",
    )
    coder_openai_base_url: str = Field(
        default="http://127.0.0.1:8000/v1", description="OpenAI-compatible endpoint (vLLM), with /v1."
    )
    coder_openai_api_key: SecretStr | None = Field(default=None, description="Bearer key for the endpoint; never logged.")
    coder_model: str | None = Field(
        default=None, description="Model name sent to the endpoint; the first one it lists when unset."
    )
    coder_hf_model_path: Path | None = Field(default=None, description="Local Hugging Face model directory for the hf backend.")
    coder_lora_path: Path | None = Field(default=None, description="LoRA adapter loaded on top of the hf model at start.")
    coder_adapters_kept: int | None = Field(
        default=2, ge=1, description="Adapters a worker keeps loaded: the served version and the latest before it (None: all)."
    )
    coder_request_timeout_s: float = Field(
        default=600.0, gt=0, description="Read timeout of one chat request (long generations)."
    )
    coder_max_retries: int = Field(default=4, ge=0, description="Retries of a request on connect errors, 429 and 5xx.")
    coder_max_concurrency: int = Field(default=8, ge=1, description="Chat requests in flight at once per process.")
    coder_system_prompt_cuda: str | None = Field(default=None, description="Replaces the built-in CUDA system prompt.")
    coder_system_prompt_triton: str | None = Field(default=None, description="Replaces the built-in Triton system prompt.")
    coder_temperature: float = Field(default=0.7, ge=0, description="Default sampling temperature.")
    coder_top_p: float = Field(default=0.95, gt=0, le=1, description="Default nucleus sampling mass.")
    coder_max_tokens: int = Field(default=4096, ge=1, description="Default cap on generated tokens per reply.")

    @model_validator(mode="after")
    def _visibility_outlives_jobs(self) -> Settings:
        # Redis redelivers an unacked message after the visibility timeout: it must exceed the
        # hard limit, or a long GPU job would run twice.
        if self.visibility_timeout_s <= self.task_hard_time_limit_s:
            raise ValueError("KZ_VISIBILITY_TIMEOUT_S must exceed KZ_TASK_HARD_TIME_LIMIT_S")
        if self.task_soft_time_limit_s >= self.task_hard_time_limit_s:
            raise ValueError("KZ_TASK_SOFT_TIME_LIMIT_S must be below KZ_TASK_HARD_TIME_LIMIT_S")
        # A live worker whose beats run a little late (a busy host, a slow database) must not be
        # taken for dead: its job would be sent again while it still runs.
        if self.worker_dead_after_s < 3 * self.worker_heartbeat_s:
            raise ValueError("KZ_WORKER_DEAD_AFTER_S must be at least three KZ_WORKER_HEARTBEAT_S")
        return self

    # pydantic's computed field over a property, which mypy does not follow
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
