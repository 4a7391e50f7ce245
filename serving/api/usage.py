"""What each tenant used, from the engine's own outputs: every engine request vLLM's app starts
(chat, completions, responses, batch lines alike) is counted when it ends, with its prompt tokens,
the prompt tokens found in the prefix cache and its output tokens, as vLLM counts them for the
`usage` it answers (`len(prompt_token_ids)`, the sum of each choice's token ids). The counts feed
the tenant's tokens-per-minute window, the Prometheus counters with a `tenant` label and the
usage ledger kept in the store by day (serving/state/ledger.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from serving.config.access import DEFAULT_TENANT
from serving.state.ledger import Tally, day_of
from serving.state.quota_store import QuotaStore
from serving.state.tenancy import current_principal


@dataclass(frozen=True)
class Usage:
    """One engine request's use (or a refusal: no tokens, `outcome` "refused")."""

    tenant: str
    model: str
    adapter: str  # "" for the base model
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    outcome: str = "ok"  # ok | error | refused
    metered: bool = False  # the tenant has a tokens_per_minute limit: its window counts these


Sink = Callable[[Usage], None]


class TokenCount:
    """The tokens of one engine request's outputs as they stream (deltas or cumulative)."""

    def __init__(self, sampling_params: Any) -> None:
        kind = getattr(sampling_params, "output_kind", None)
        self.delta = getattr(kind, "name", "") == "DELTA"
        self.prompt = 0
        self.cached = 0
        self.outputs: dict[int, int] = {}

    def add(self, output: Any) -> None:
        self.prompt = len(getattr(output, "prompt_token_ids", None) or []) or self.prompt
        self.cached = getattr(output, "num_cached_tokens", None) or self.cached
        for choice in getattr(output, "outputs", None) or []:
            tokens = len(getattr(choice, "token_ids", None) or [])
            index = getattr(choice, "index", 0)
            self.outputs[index] = self.outputs.get(index, 0) + tokens if self.delta else tokens


def adapter_of(kwargs: dict[str, Any]) -> str:
    lora = kwargs.get("lora_request")
    return str(getattr(lora, "lora_name", "") or "")


def counted(
    outputs: AsyncIterator[Any], sampling_params: Any, model: str, adapter: str, sink: Sink
) -> AsyncIterator[Any]:
    """`outputs` (an engine request's stream) as it is, its use sent to `sink` when it ends, for
    the principal of the request that started it."""
    principal = current_principal.get()
    tenant = principal.tenant if principal else DEFAULT_TENANT
    metered = principal is not None and principal.settings.tokens_per_minute is not None

    async def streaming() -> AsyncIterator[Any]:
        count = TokenCount(sampling_params)
        outcome = "error"
        try:
            async for output in outputs:
                count.add(output)
                yield output
            outcome = "ok"
        except (asyncio.CancelledError, GeneratorExit):
            outcome = "ok"  # the client left or the deadline passed: what ran is still used
            raise
        finally:
            used = sum(count.outputs.values())
            tokens = (count.prompt, count.cached, used)
            sink(Usage(tenant, model, adapter, *tokens, outcome=outcome, metered=metered))

    return streaming()


class UsageRecorder:
    """The sink of every engine request's use on a replica: the ledger's tally, the tenant
    counters, and the tokens-per-minute window of a metered tenant."""

    def __init__(self, tally: Tally, store: QuotaStore, metrics: Any = None) -> None:
        self.tally = tally
        self.store = store
        self.metrics = metrics  # PlatformMetrics, or None in tests
        self.served: list[Callable[[str, float], None]] = []  # fair share's token counters

    def __call__(self, usage: Usage) -> None:
        now = time.time()
        row = (day_of(now), usage.tenant, usage.model, usage.adapter)
        self.tally.add(
            row,
            requests=int(usage.outcome != "refused"),
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            output_tokens=usage.output_tokens,
            errors=int(usage.outcome == "error"),
            refusals=int(usage.outcome == "refused"),
        )
        if self.metrics is not None:
            self.metrics.record_usage(usage)
        tokens = usage.prompt_tokens + usage.output_tokens
        for charge in self.served:
            charge(usage.tenant, tokens)
        if usage.metered and tokens:
            with contextlib.suppress(RuntimeError):  # no running loop: nothing to count into
                asyncio.get_running_loop().run_in_executor(
                    None, self.store.add_tokens, usage.tenant, now, tokens
                )
