"""How the model router picks a replica of a model: each model's `routing` in the config names a
Serve request router (`request_router_config` of its deployment, `ROUTER_CONFIGS` in
serving/config/platform.py), which sees the `RoutingHint` the router passes with every request.

- power_of_two: Serve's default; the less loaded of two random replicas.
- prefix_cache: Ray's `PrefixCacheAffinityRouter` (its prefix tree): the replica whose earlier
  prompts share the longest prefix with this one (its KV cache likely holds it); a prompt that
  matches none goes by power of two choices.
- session: every request of a session (`x-session-id` header, else the OpenAI `user` field) to
  the same replica, so a conversation's history stays in one KV cache: a new session goes to the
  replica with the fewest live sessions (ties: rendezvous hashing), so a few conversations spread
  evenly; the next-ranked replica takes it when that one is full. No session: power of two.
- load_aware: the replica with the lowest load score, its share of ongoing requests (the
  router's count) plus its engine's KV-cache use (`record_routing_stats` on the replica, polled
  by Serve's controller every second), as llm-d's queue and KV-cache scorers:
  of two replicas with as many requests, the one holding shorter contexts.
- random: any replica, uniformly, blind to load, adapters and caches: the baseline the others
  are measured against."""

from __future__ import annotations

import hashlib
import random
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.llm.request_router import PrefixCacheAffinityRouter
from ray.serve.request_router import LocalityMixin, MultiplexMixin, RequestRouter
from starlette.datastructures import Headers

from serving.tracing import spans
from serving.tracing.decisions import note_decision, record_decision
from serving.tracing.setup import tracer

SESSION_HEADER = "x-session-id"
NO_TEXT = "\0"  # what the prefix router matches for a request without text
SESSION_IDLE_S = 600.0  # a session unseen this long no longer counts on its replica
MAX_SESSIONS = 100_000  # bounds the router's memory: the least recently seen go first


@dataclass(frozen=True)
class RoutingHint:
    """What a request router may know of a request without parsing it again. `prompt` is what
    PrefixCacheAffinityRouter reads: a prompt string or list, or chat messages."""

    prompt: Any = ""
    session: str | None = None
    traceparent: str | None = None  # the router's span: the routing decision's parent


def routing_hint(body: Any, headers: Headers) -> RoutingHint:
    """The hint of a request: its prompt (completions), messages (chat) or input (Responses),
    and its session."""
    data = body if isinstance(body, dict) else {}
    prompt = next((data[key] for key in ("prompt", "messages", "input") if key in data), "")
    session = headers.get(SESSION_HEADER) or data.get("user")
    return RoutingHint(
        prompt=prompt,
        session=str(session) if session else None,
        traceparent=headers.get("traceparent"),
    )


def rendezvous_rank(session: str, replica_ids: list[str]) -> list[str]:
    """Replicas in the session's order of preference (highest random weight first): a session
    keeps its replica while replicas come and go, and only a gone replica's sessions move."""

    def weight(replica_id: str) -> bytes:
        return hashlib.sha256(f"{session}\0{replica_id}".encode()).digest()

    return sorted(replica_ids, key=weight, reverse=True)


@dataclass
class SessionTable:
    """Where each live session stays (in the order they were last seen)."""

    placed: OrderedDict[str, tuple[str, float]] = field(default_factory=OrderedDict)

    def place(self, session: str, replica_ids: list[str], now: float) -> list[str]:
        """The session's replicas in order of preference: its own first (placed on the replica
        with the fewest live sessions when it has none, or its replica is gone)."""
        while self.placed and (
            len(self.placed) >= MAX_SESSIONS
            or next(iter(self.placed.values()))[1] < now - SESSION_IDLE_S
        ):
            self.placed.popitem(last=False)
        ranked = rendezvous_rank(session, replica_ids)
        own = self.placed.pop(session, ("", 0.0))[0]
        if own not in replica_ids:
            live = Counter(replica for replica, _ in self.placed.values())
            own = min(ranked, key=lambda replica: live[replica])  # ties: the first ranked
        self.placed[session] = (own, now)
        return [own] + [replica for replica in ranked if replica != own]


def load_score(ongoing: int, max_ongoing: int, kv_cache_usage: float) -> float:
    """How loaded a replica is, from 0 (idle) to 2 (full queue, full KV cache): its ongoing
    requests as a share of its limit plus the share of its KV cache in use, weighted equally."""
    return ongoing / max(1, max_ongoing) + kv_cache_usage


def hint_of(pending_request: Any) -> RoutingHint | None:
    """The request's hint, found by its fields, not its class: the router Serve runs may be a
    copy of this module's class (shipped pickled), whose RoutingHint is another class object."""
    args = getattr(pending_request, "args", None) or []
    return next((arg for arg in args if hasattr(arg, "session") and hasattr(arg, "prompt")), None)


class TracedDecisions:
    """Each placed request's routing decision as a span (tracing on): its policy, the replica,
    and why, as the policy noted it in choose_replicas (serving/tracing/decisions.py)."""

    policy = ""

    def on_request_routed(self, pending_request: Any, replica_id: Any, result: Any) -> None:
        self.trace_decision(pending_request, replica_id)
        super().on_request_routed(pending_request, replica_id, result)  # type: ignore[misc]  # the router class this mixes into has it

    def trace_decision(self, pending_request: Any, replica_id: Any) -> None:
        if tracer() is None:  # tracing off: nothing more per placed request
            return
        candidates = len(getattr(self, "curr_replicas", None) or {})
        record_decision(
            self.policy, pending_request, replica_id, candidates, hint_of(pending_request)
        )


class PowerOfTwoRouter(TracedDecisions, PowerOfTwoChoicesRequestRouter):
    """Serve's default router (the less loaded of two random replicas, adapter holders first),
    with its decisions traced."""

    policy = "power_of_two"

    async def choose_replicas(
        self, candidate_replicas: list[Any], pending_request: Any = None
    ) -> list[list[Any]]:
        ranks = await super().choose_replicas(candidate_replicas, pending_request)
        note_decision(
            pending_request,
            f"the less loaded of two random replicas among {len(candidate_replicas)}",
        )
        return ranks


class PrefixAffinityRouter(TracedDecisions, PrefixCacheAffinityRouter):
    """Ray's prefix-cache affinity router (its prefix tree actor) with three changes, each
    measured (docs/benchmarks/routing.md): a prompt that matches no replica's earlier prompts goes
    by power of two choices, not to the replica whose tree is smallest (which herds a burst of new
    prompts onto one replica: -19 % throughput with no shared prefixes); the tree is read and
    written without blocking the router's event loop (Ray's `ray.get` stalls every stream the
    router relays); the tree evicts old prompts (Ray's default keeps every prompt forever)."""

    policy = "prefix_cache"

    def initialize_state(self, *args: Any, **kwargs: Any) -> None:
        # Serve passes the deployment's `request_router_kwargs` by name.
        super().initialize_state(*args, **{"do_eviction": True} | kwargs)

    def _extract_text_from_request(self, pending_request: Any) -> str:
        # A request with no text (a GET, an empty prompt, a call without a hint such as an
        # adapter load) matches nothing instead of dividing by its zero length or raising.
        try:
            return super()._extract_text_from_request(pending_request) or NO_TEXT
        except ValueError:
            return NO_TEXT

    async def _prefix_match_best_replicas(  # type: ignore[override]  # Ray's hint is wrong: it too returns [[...]]
        self, pending_request: Any, candidate_replicas: list[Any]
    ) -> list[list[Any]]:
        """The candidates whose earlier prompts share the longest prefix with this one, when it
        covers at least `match_rate_threshold` of it; else none (power of two choices)."""
        text = self._extract_text_from_request(pending_request)
        ids = [replica.replica_id.to_full_id_str() for replica in candidate_replicas]
        matched, tenants = await self._tree_actor.prefix_match.remote(text, ids)
        threshold = self._match_rate_threshold
        assert threshold is not None, "Ray defaults it to 0.1; null is no threshold"
        if not tenants or len(matched) < threshold * len(text):
            note_decision(
                pending_request,
                f"no replica's prompts share {threshold:.0%} of this one "
                f"(longest {len(matched)}/{len(text)} chars): power of two choices",
                **{spans.ROUTING_PREFIX_MATCH: len(matched)},
            )
            return [[]]
        note_decision(
            pending_request,
            f"prefix match {len(matched)}/{len(text)} chars with {len(tenants)} replica(s)",
            **{spans.ROUTING_PREFIX_MATCH: len(matched)},
        )
        by_id = dict(zip(ids, candidate_replicas))
        return [[by_id[tenant] for tenant in tenants if tenant in by_id]]

    def on_request_routed(self, pending_request: Any, replica_id: Any, result: Any) -> None:
        text = self._extract_text_from_request(pending_request)
        if text != NO_TEXT:  # actor calls from one caller run in order: the next match sees it
            self._tree_actor.insert.remote(text, replica_id.to_full_id_str(), time.time())
        self.trace_decision(pending_request, replica_id)  # not Ray's own insert


class SessionAffinityRouter(TracedDecisions, LocalityMixin, MultiplexMixin, RequestRouter):
    """A session's requests to its replica (`SessionTable`; next ranks when it is full);
    requests without a session to the less loaded of two random replicas. No FIFOMixin: it
    routes without the request (a replica goes to whichever request waits longest), so a
    session could not choose."""

    policy = "session"

    async def choose_replicas(
        self, candidate_replicas: list[Any], pending_request: Any = None
    ) -> list[list[Any]]:
        hint = hint_of(pending_request)
        if hint is None or hint.session is None or len(candidate_replicas) < 2:
            note_decision(pending_request, "no session (or one replica): power of two choices")
            return self.two_choices(candidate_replicas, pending_request)
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        if getattr(self, "sessions", None) is None:  # Serve builds routers without our __init__
            self.sessions = SessionTable()
        known = hint.session in self.sessions.placed
        ranked = self.sessions.place(hint.session, list(by_id), time.monotonic())
        why = "its session's replica" if known else "a new session: the replica with fewest"
        note_decision(pending_request, why, **{spans.ROUTING_SESSION: hint.session})
        return [[by_id[rid]] for rid in ranked]

    def two_choices(self, candidate_replicas: list[Any], pending_request: Any) -> list[list[Any]]:
        """Power of two choices among the replicas holding the request's adapter when some
        do (Serve's multiplexing), else among all."""
        candidates = adapter_holders(self, candidate_replicas, pending_request)
        return [random.sample(candidates, min(2, len(candidates)))]


def adapter_holders(
    router: MultiplexMixin, candidate_replicas: list[Any], pending_request: Any
) -> list[Any]:
    """The candidates holding the request's adapter when some do (Serve's multiplexing), else
    all of them."""
    metadata = getattr(pending_request, "metadata", None)
    if not getattr(metadata, "multiplexed_model_id", None):
        return candidate_replicas
    holders = router.apply_multiplex_routing(pending_request=pending_request)
    by_id = {r.replica_id: r for r in candidate_replicas}
    return [by_id[rid] for rid in holders if rid in by_id] or candidate_replicas


class LoadAwareRouter(TracedDecisions, MultiplexMixin, RequestRouter):
    """Replicas ranked by `load_score`, least loaded first (ties in random order), among those
    holding the request's adapter when some do. Ongoing requests come from the router's own
    count (fresh at every request), KV-cache use from the engine's latest routing stats."""

    policy = "load_aware"

    async def choose_replicas(
        self, candidate_replicas: list[Any], pending_request: Any = None
    ) -> list[list[Any]]:
        candidates = adapter_holders(self, candidate_replicas, pending_request)
        shuffled = random.sample(candidates, len(candidates))
        ranked = sorted(shuffled, key=self.score)
        best = self.score(ranked[0]) if ranked else 0.0
        note_decision(
            pending_request,
            f"the lowest load score ({best:.3f}) of {len(candidates)} replica(s)",
            **{spans.ROUTING_LOAD_SCORE: round(best, 4)},
        )
        return [[replica] for replica in ranked]

    def score(self, replica: Any) -> float:
        stats = replica.routing_stats or {}
        ongoing = self.replica_queue_len_cache.get(replica.replica_id)
        if ongoing is None:  # not routed to lately: the engine's own count
            ongoing = stats.get("running", 0) + stats.get("waiting", 0)
        return load_score(ongoing, replica.max_ongoing_requests, stats.get("kv_cache_usage", 0.0))


class RandomRouter(TracedDecisions, RequestRouter):
    """Any replica, uniformly (the next ones in random order when it is full)."""

    policy = "random"

    async def choose_replicas(
        self, candidate_replicas: list[Any], pending_request: Any = None
    ) -> list[list[Any]]:
        return [[replica] for replica in random.sample(candidate_replicas, len(candidate_replicas))]
