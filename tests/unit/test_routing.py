"""Routing policies: each model's `routing` becomes its deployment's Serve request router, and the
session router keeps a session on one replica (falling back down its rank when that one is full)."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace

from serving.config import parse_config
from serving.k8s.serve_config import serve_config
from serving.routing import (
    SESSION_IDLE_S,
    LoadAwareRouter,
    PrefixAffinityRouter,
    RandomRouter,
    RoutingHint,
    SessionAffinityRouter,
    SessionTable,
    load_score,
    rendezvous_rank,
)


def replicas(count: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(replica_id=SimpleNamespace(unique_id=f"r{i}")) for i in range(count)]


def choose(candidates: list[SimpleNamespace], hint: RoutingHint | None) -> list[list[str]]:
    router = SessionAffinityRouter.__new__(SessionAffinityRouter)  # no Serve state needed here
    request = SimpleNamespace(args=[{}, b"", hint] if hint else [])
    ranks = asyncio.run(router.choose_replicas(candidates, request))
    return [[r.replica_id.unique_id for r in rank] for rank in ranks]


def test_each_policy_is_its_deployments_request_router() -> None:
    models = [
        {"name": "a", "routing": "prefix_cache"},
        {"name": "b", "routing": "session"},
        {"name": "c"},
    ]
    apps = {
        a["name"]: a
        for a in serve_config(parse_config({"models": models}), "127.0.0.1")["applications"]
    }
    options = {name: apps[f"vllm-{name}"]["deployments"][0] for name in "abc"}
    assert options["a"]["request_router_config"]["request_router_class"] == (
        "serving.routing:PrefixAffinityRouter"
    )
    assert options["b"]["request_router_config"]["request_router_class"] == (
        "serving.routing:SessionAffinityRouter"
    )
    # The default, power of two, is Serve's own router with its decisions traced.
    assert options["c"]["request_router_config"]["request_router_class"] == (
        "serving.routing:PowerOfTwoRouter"
    )


def test_a_session_always_ranks_the_same_replica_first_and_sessions_spread() -> None:
    ranks = choose(replicas(4), RoutingHint("p", "session-1"))
    assert sorted(r[0] for r in ranks) == ["r0", "r1", "r2", "r3"]  # every replica, ranked
    assert choose(replicas(4), RoutingHint("other prompt", "session-1")) == ranks
    firsts = Counter(choose(replicas(4), RoutingHint("", f"s{i}"))[0][0] for i in range(200))
    assert len(firsts) == 4 and min(firsts.values()) > 20


def test_a_gone_replica_moves_only_its_own_sessions() -> None:
    sessions = [f"s{i}" for i in range(100)]
    before = {s: rendezvous_rank(s, ["r0", "r1", "r2"])[0] for s in sessions}
    after = {s: rendezvous_rank(s, ["r0", "r1"])[0] for s in sessions}
    moved = {s for s in sessions if before[s] != after[s]}
    assert moved == {s for s in sessions if before[s] == "r2"}


def test_no_session_is_power_of_two_choices() -> None:
    ranks = choose(replicas(4), RoutingHint("p", None))
    assert len(ranks) == 1 and len(ranks[0]) == 2 and len(set(ranks[0])) == 2
    assert choose(replicas(4), None)[0][0] in {"r0", "r1", "r2", "r3"}


def test_the_prefix_router_takes_a_request_without_text() -> None:
    router = PrefixAffinityRouter.__new__(PrefixAffinityRouter)
    for prompt in ("", [], [{"role": "user", "content": ""}]):
        request = SimpleNamespace(args=[{}, b"", RoutingHint(prompt)])
        assert router._extract_text_from_request(request)
    request = SimpleNamespace(args=[{}, b"", RoutingHint([{"role": "user", "content": "hi"}])])
    assert router._extract_text_from_request(request) == "hi"


class FakeTree:
    """The prefix tree actor's two calls the router makes, awaitable as Ray's ObjectRefs are."""

    def __init__(self, matched: str, tenants: list[str] | None) -> None:
        self.prefix_match = SimpleNamespace(remote=lambda text, ids: self.answer(matched, tenants))
        self.inserted: list[tuple[str, str]] = []
        self.insert = SimpleNamespace(
            remote=lambda text, rid, at: self.inserted.append((text, rid))
        )

    async def answer(self, matched: str, tenants: list[str] | None):
        return matched, tenants


def prefix_router(tree: FakeTree) -> PrefixAffinityRouter:
    router = PrefixAffinityRouter.__new__(PrefixAffinityRouter)
    router._tree_actor, router._match_rate_threshold = tree, 0.1
    return router


def full_ids(candidates: list) -> list:
    for replica in candidates:
        replica.replica_id.to_full_id_str = lambda rid=replica.replica_id.unique_id: rid
    return candidates


def test_a_prompt_matching_a_replica_goes_there_and_no_match_goes_by_two_choices() -> None:
    request = SimpleNamespace(args=[{}, b"", RoutingHint("hello world, how are you")])
    candidates = full_ids(replicas(2))
    chosen = asyncio.run(
        prefix_router(FakeTree("hello world", ["r1"]))._prefix_match_best_replicas(
            request, candidates
        )
    )
    assert chosen == [[candidates[1]]]
    for matched, tenants in (("h", ["r1"]), ("", None)):  # under 10 % of the prompt, or nothing
        chosen = asyncio.run(
            prefix_router(FakeTree(matched, tenants))._prefix_match_best_replicas(
                request, candidates
            )
        )
        assert chosen == [[]]  # Ray's choose_replicas then takes its power-of-two choice


def test_the_prefix_router_records_prompts_but_not_calls_without_text() -> None:
    tree = FakeTree("", None)
    router = prefix_router(tree)
    rid = SimpleNamespace(to_full_id_str=lambda: "r0")
    router.on_request_routed(SimpleNamespace(args=[{}, b"", RoutingHint("hello")]), rid, None)
    router.on_request_routed(SimpleNamespace(args=["adapter-a", "/path"]), rid, None)
    assert tree.inserted == [("hello", "r0")]


def test_random_policy_offers_every_replica_once() -> None:
    router = RandomRouter.__new__(RandomRouter)  # no Serve state needed here
    ranks = asyncio.run(router.choose_replicas(replicas(4)))
    assert all(len(rank) == 1 for rank in ranks)
    assert sorted(rank[0].replica_id.unique_id for rank in ranks) == ["r0", "r1", "r2", "r3"]


def test_a_few_sessions_spread_evenly_and_stay_put() -> None:
    table = SessionTable()
    ids = ["r0", "r1"]
    first = {f"s{i}": table.place(f"s{i}", ids, now=0.0)[0] for i in range(8)}
    assert Counter(first.values()) == {"r0": 4, "r1": 4}
    assert all(table.place(s, ids, now=1.0)[0] == r for s, r in first.items())
    # a third replica takes new sessions; a gone replica's sessions move, the others stay
    assert table.place("new", ["r0", "r1", "r2"], now=2.0)[0] == "r2"
    moved = {s: table.place(s, ["r1", "r2"], now=3.0)[0] for s in first}
    assert all(moved[s] == "r1" for s, r in first.items() if r == "r1")
    assert all(moved[s] in ("r1", "r2") for s in first)


def test_idle_sessions_stop_counting() -> None:
    table = SessionTable()
    for i in range(4):
        table.place(f"old{i}", ["r0"], now=0.0)
    assert table.place("fresh", ["r0", "r1"], now=SESSION_IDLE_S + 1)[0] in ("r0", "r1")
    assert list(table.placed) == ["fresh"]


def loaded_replica(name: str, stats: dict, limit: int = 8) -> SimpleNamespace:
    return SimpleNamespace(replica_id=name, routing_stats=stats, max_ongoing_requests=limit)


def load_aware_ranks(
    candidates: list[SimpleNamespace], ongoing: dict[str, int], holders: set[str] | None = None
) -> list[str]:
    router = LoadAwareRouter.__new__(LoadAwareRouter)  # no Serve state but these two
    router._replica_queue_len_cache = SimpleNamespace(get=ongoing.get)
    router.apply_multiplex_routing = lambda pending_request: holders
    metadata = SimpleNamespace(multiplexed_model_id="adapter" if holders else "")
    ranks = asyncio.run(router.choose_replicas(candidates, SimpleNamespace(metadata=metadata)))
    assert all(len(rank) == 1 for rank in ranks)
    return [rank[0].replica_id for rank in ranks]


def test_load_score_weighs_queue_share_and_kv_cache_use_alike() -> None:
    assert load_score(0, 8, 0.0) == 0.0
    assert load_score(8, 8, 1.0) == 2.0
    assert load_score(4, 8, 0.0) == load_score(0, 8, 0.5)


def test_load_aware_prefers_fewer_requests_then_shorter_contexts() -> None:
    short, long_ = (
        loaded_replica("short", {"kv_cache_usage": 0.1}),
        loaded_replica("long", {"kv_cache_usage": 0.7}),
    )
    assert load_aware_ranks([long_, short], {"short": 2, "long": 2}) == ["short", "long"]
    assert load_aware_ranks([long_, short], {"short": 7, "long": 2}) == ["long", "short"]
    # a replica this router has not sent to lately counts what its engine reports
    busy = loaded_replica("busy", {"running": 6, "waiting": 2, "kv_cache_usage": 0.1})
    assert load_aware_ranks([busy, short], {"short": 2}) == ["short", "busy"]


def test_load_aware_keeps_an_adapters_requests_on_its_holders() -> None:
    idle, holder = loaded_replica("idle", {}), loaded_replica("holder", {"kv_cache_usage": 0.5})
    assert load_aware_ranks([idle, holder], {"holder": 4}, holders={"holder"}) == ["holder"]
    assert load_aware_ranks([idle, holder], {"holder": 4}) == ["idle", "holder"]
