"""Who may call the platform and how much one request may ask: API keys, the tenants they belong
to, and request limits, the `auth` and `limits` parts of PlatformConfig that every app reads."""

from __future__ import annotations

from pydantic import Field, model_validator

from serving.config.replica import StrictModel

API_KEYS_ENV = "LLM_SERVING_API_KEYS"
# The tenant of keys that belong to no tenant (auth.api_keys, auth.api_keys_env), and of every
# request when no key is configured.
DEFAULT_TENANT = "default"
TENANT_NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"  # a DNS label: also a Kubernetes name part


class TenantConfig(StrictModel):
    """One team or application sharing the endpoint: its keys, and what it may use. Stored
    responses, files and batches belong to the tenant whose key created them; another tenant
    sees none of them (404)."""

    name: str = Field(
        pattern=TENANT_NAME,
        description="The tenant's name (a DNS label), shown in the usage ledger and metrics. "
        f"`{DEFAULT_TENANT}` names the tenant of the keys in auth.api_keys/api_keys_env: list it "
        "(without keys of its own) to give those keys limits.",
    )
    api_keys: list[str] = Field(
        default_factory=list,
        repr=False,
        description="The tenant's keys. Local runs only, as auth.api_keys: the chart and the "
        "LLMService take them from a Secret into api_keys_env.",
    )
    api_keys_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable each replica reads the tenant's keys from, "
        "comma-separated (the chart fills it from the tenant's Secret).",
    )
    may_set_priority: bool = Field(
        False,
        description="Whether the tenant's requests may set vLLM's `priority` (the body field or "
        "the X-Vllm-Priority header); otherwise a non-zero priority is refused (403).",
    )
    admin: bool = Field(
        False,
        description="Whether the tenant's keys may read every tenant's usage ledger (GET "
        "/v1/usage); other tenants get 403. With no key configured at all the default tenant "
        "may (everything is open then).",
    )
    weight: float = Field(
        1.0,
        gt=0,
        description="The tenant's share of a saturated replica, relative to the others' (2.0: "
        "twice the tokens of a tenant of weight 1 while both wait).",
    )
    requests_per_minute: int | None = Field(
        None,
        gt=0,
        description="Most requests the tenant may send in a minute (fixed one-minute windows, "
        "counted in the store across every replica); more: 429 with Retry-After. Unset: no limit.",
    )
    tokens_per_minute: int | None = Field(
        None,
        gt=0,
        description="Most prompt + output tokens the tenant may use in a minute; a request that "
        "arrives once the minute's tokens reach it is a 429 (tokens are counted when a request "
        "ends, so the last one admitted may pass it). Unset: no limit.",
    )
    max_concurrent_requests: int | None = Field(
        None,
        gt=0,
        description="Most requests of the tenant in flight at once over every replica; more: 429. "
        "Unset: no limit.",
    )
    max_stored_bytes: int | None = Field(
        None,
        gt=0,
        description="Most bytes of stored responses and files the tenant may hold; a new file or "
        "stored response past it is refused (429 storage_quota_exceeded) instead of evicting "
        "anything. Unset: no limit of its own (state.max_bytes still bounds the store).",
    )
    max_running_batches: int | None = Field(
        None,
        gt=0,
        description="Most batches of the tenant running at once; another is refused (429 "
        "batch_quota_exceeded). Unset: no limit.",
    )

    @property
    def rate_limited(self) -> bool:
        """Whether its requests are counted against shared limits (a store call each)."""
        limits = (self.requests_per_minute, self.tokens_per_minute, self.max_concurrent_requests)
        return any(limit is not None for limit in limits)

    @model_validator(mode="after")
    def _check_keys(self) -> TenantConfig:
        if any(not key.strip() for key in self.api_keys):
            raise ValueError(f"tenant {self.name}: api_keys must not contain empty keys")
        return self


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

    tenants: list[TenantConfig] = Field(
        default_factory=list,
        description="Tenants sharing the endpoint, each with its own keys and its own stored "
        f"responses, files and batches. Keys above belong to the tenant `{DEFAULT_TENANT}`. A key "
        "in two tenants is refused (when the replicas start, for keys from the environment).",
    )

    @model_validator(mode="after")
    def _check_keys(self) -> AuthConfig:
        if any(not key.strip() for key in self.api_keys):
            raise ValueError("api_keys must not contain empty keys")
        names = [tenant.name for tenant in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError(f"auth.tenants: names must differ ({names})")
        owners: dict[str, str] = {key: DEFAULT_TENANT for key in self.api_keys}
        for tenant in self.tenants:
            if tenant.name == DEFAULT_TENANT and (tenant.api_keys or tenant.api_keys_env):
                raise ValueError(
                    f"auth.tenants: `{DEFAULT_TENANT}` takes the keys of auth.api_keys and "
                    "auth.api_keys_env; give it none of its own"
                )
            for key in tenant.api_keys:
                if owners.setdefault(key, tenant.name) != tenant.name:
                    raise ValueError(
                        f"auth.tenants: a key of {tenant.name} is also a key of "
                        f"{owners[key]}; a key belongs to one tenant"
                    )
        envs = [t.api_keys_env for t in self.tenants if t.api_keys_env] + [self.api_keys_env]
        envs = [env for env in envs if env]
        if len(set(envs)) != len(envs):
            raise ValueError(f"auth.tenants: each api_keys_env must differ ({envs})")
        return self

    def tenant(self, name: str) -> TenantConfig:
        """A tenant's settings; the default tenant's are its entry's, when listed."""
        found = next((tenant for tenant in self.tenants if tenant.name == name), None)
        return found or TenantConfig(name=name)


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
