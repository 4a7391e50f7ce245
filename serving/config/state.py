"""Where the platform keeps what must outlive a replica (stored Responses, uploaded files, batches)
and how the Batch API runs: the `state` part of PlatformConfig that the vLLM app and the model
router read."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, model_validator

from serving.config.replica import StrictModel

DAY_S = 24 * 3600


class BatchSettings(StrictModel):
    """The OpenAI Batch API (`/v1/files`, `/v1/batches`): its lines run on the vLLM replicas
    themselves, below online requests in vLLM's priority scheduler."""

    enabled: bool = Field(True, description="Serve `/v1/files` and `/v1/batches`.")
    max_file_bytes: int = Field(
        100 * 1024 * 1024,
        gt=0,
        description="Largest file `/v1/files` accepts in bytes (larger: 413).",
    )
    max_lines: int = Field(
        50_000, gt=0, description="Most requests one batch's input file may hold (more: 400)."
    )
    concurrency: int = Field(
        4,
        gt=0,
        description="Batch lines each vLLM replica runs at once; a replica starts none while "
        "online requests wait in its engine's queue.",
    )
    priority: int = Field(
        10,
        description="vLLM priority of a batch line (online requests have 0; a larger value "
        "is scheduled later and preempted first). Needs the engine's priority scheduling, "
        "which the platform turns on while the Batch API is enabled.",
    )


class StateConfig(StrictModel):
    """One store for the platform's state, shared by every replica: SQLite on one machine, a
    PostgreSQL server on a cluster. Bounded in age and size (vLLM's own store never frees)."""

    url: str | None = Field(
        None,
        description="SQLAlchemy URL of the store, e.g. postgresql+psycopg://llm@db:5432/llm "
        "(no password in it: see password_env). Unset: a SQLite file under the platform's cache "
        "directory, which only replicas on one machine share.",
    )
    password_env: str | None = Field(
        "LLM_SERVING_STATE_PASSWORD",
        description="Environment variable holding the database password (the chart fills it "
        "from a Secret); unset or empty: none.",
    )
    ttl_s: float = Field(
        30 * DAY_S,
        gt=0,
        description="Stored responses, files and finished batches are deleted this long after "
        "they were written (OpenAI keeps responses 30 days).",
    )
    max_bytes: int = Field(
        1024**3,
        gt=0,
        description="Size cap of the store in bytes; over it the oldest records are evicted "
        "(never a running batch or its input file).",
    )
    responses: bool = Field(
        True,
        description="Keep Responses API responses with `store: true` (OpenAI's default), so "
        "`previous_response_id`, retrieval, deletion and background mode work on any replica.",
    )
    max_background_responses: int = Field(
        8,
        gt=0,
        description="Background responses (`background: true`) one replica runs at once; more "
        "is a 429. A background run holds no connection, so Serve's queue limits do not count it.",
    )
    batch: BatchSettings = Field(default_factory=BatchSettings, description="The Batch API.")

    @model_validator(mode="after")
    def _check_url(self) -> StateConfig:
        if self.url is not None and not self.url.startswith(("sqlite", "postgresql")):
            raise ValueError("url must be a sqlite:// or postgresql+psycopg:// URL")
        if self.url is not None and urlsplit(self.url).password is not None:
            raise ValueError("url must not carry a password: set it in password_env's variable")
        return self
