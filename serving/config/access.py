"""Who may call the platform and how much one request may ask: API keys and request limits,
the `auth` and `limits` parts of PlatformConfig that every app reads."""

from __future__ import annotations

from pydantic import Field, model_validator

from serving.config.replica import StrictModel

API_KEYS_ENV = "LLM_SERVING_API_KEYS"


class AuthConfig(StrictModel):
    """Bearer API keys. Auth is on when any key is configured (here or in the environment)."""

    # repr=False: a logged or printed config never shows a key.
    api_keys: list[str] = Field(
        default_factory=list,
        repr=False,
        description="Accepted API keys (clients send `Authorization: Bearer KEY`). Local runs "
        "only: the chart and the LLMService refuse keys here (they would travel in the serve "
        "config); on Kubernetes api_keys_env is filled from a Secret.",
    )
    api_keys_env: str | None = Field(
        API_KEYS_ENV,
        description="Environment variable each replica reads more keys from, comma-separated "
        "(the chart fills it from a Secret); null reads none.",
    )

    @model_validator(mode="after")
    def _check_keys(self) -> AuthConfig:
        if any(not key.strip() for key in self.api_keys):
            raise ValueError("api_keys must not contain empty keys")
        return self


class RequestLimits(StrictModel):
    """Limits on one request to the OpenAI routes (vLLM and baseline apps); a breach is a 4xx
    whose message names the field. The body limit applies to the analysis app too."""

    max_body_bytes: int = Field(
        2 * 1024 * 1024, gt=0, description="Largest request body in bytes (larger: 413)."
    )
    max_prompt_tokens: int | None = Field(
        None, gt=0, description="Longest prompt in tokens (longer: 400); unset = max_model_len."
    )
    max_tokens: int | None = Field(
        None,
        gt=0,
        description="Most tokens one choice may ask for (`max_tokens`, `max_completion_tokens`, "
        "`max_output_tokens`; more: 400, beam search included); also caps the default when the "
        "request sets none.",
    )
    max_n: int = Field(
        16,
        gt=0,
        description="Most choices one request may ask for (`n`, vLLM's `best_of`; a beam search's "
        "width); more: 400. vLLM's own cap (VLLM_MAX_N_SEQUENCES) is set to it.",
    )
    max_prompts_per_request: int = Field(
        64,
        gt=0,
        description="Most prompts in one request (a `prompt` list of /v1/completions, an `input` "
        "list of /v1/embeddings); more: 400. Each prompt runs `n` sequences in the engine.",
    )
    request_timeout_s: float | None = Field(
        600.0,
        gt=0,
        description="Longest a completion may run; then it is aborted in the engine: 408, or an "
        "error event when streaming. Unset = no limit.",
    )
