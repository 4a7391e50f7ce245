"""kopf handlers for LLMService: `kopf run -m operators.llmservice [--all-namespaces | -n NS]`.

Thin: rendering, status and API calls live in operators.render / .status / .kube. An invalid spec
is reported (Degraded condition + Warning event) and left alone, never retried into a crash loop;
the next edit of the resource triggers a new attempt."""

from __future__ import annotations

import datetime
import os
from typing import Any

import httpx
import kopf

from operators import kube, render, status
from operators.spec import (
    GROUP,
    PLURAL,
    VERSION,
    LLMServiceSpec,
    SpecError,
    parse_spec,
    surge_shortfall,
    unshared_state,
)

RESOURCE = (GROUP, VERSION, PLURAL)
# How often the status follows the RayService and the metrics (and a deleted RayService returns).
SYNC_INTERVAL_S = float(os.environ.get("LLM_SERVING_OPERATOR_SYNC_S", "15"))
METRICS_TIMEOUT_S = 3.0


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fetch_text(url: str) -> str:
    response = httpx.get(url, timeout=METRICS_TIMEOUT_S)
    response.raise_for_status()
    return response.text


def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Progress and diff-base go to annotations: the CRD's status schema is the operator's own.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    # On shutdown, give the status timer a moment to leave its sleep instead of orphaning it.
    settings.background.instant_exit_timeout = 2.0
    # One API client per operator run (kept in kopf's memo, not in a global), built lazily after
    # kopf's login has configured the kubernetes client.
    memo.ray_services = kube.RayServices()
    memo.network_policies = kube.NetworkPolicies()
    memo.disruption_budgets = kube.DisruptionBudgets()
    # Rendering loads Helm's library and the chart (LLM_SERVING_CHART_DIR in the image): fail
    # fast here if the image cannot render at all, rather than on the first LLMService.
    render.render_rayservice("warm-up", "default", {"image": "warm-up"})


REJECTION_REASONS = {
    SpecError: "InvalidSpec",
    kube.OwnershipError: "RayServiceConflict",
    kube.KubeRayMissing: "KubeRayMissing",
}


def apply_network_policy(
    name: str, namespace: str, desired: dict[str, Any] | None, uid: str, memo: kopf.Memo
) -> None:
    """Create or patch the NetworkPolicy over the Ray pods; remove it when the spec turned it
    off."""
    if desired is None:
        memo.network_policies.delete(render.network_policy_name(name), namespace, owner_uid=uid)
    else:
        memo.network_policies.apply(desired, owner_uid=uid)


def live_replicas(name: str, namespace: str, spec: LLMServiceSpec) -> dict[str, int]:
    """Healthy vLLM replicas per Serve app of the running service (empty when unreadable)."""
    url = status.metrics_url(name, namespace)
    return status.read_live_replicas(url, fetch_text, status.vllm_apps(spec.platform))


def apply_budgets(
    name: str, namespace: str, desired: list[dict[str, Any]], uid: str, memo: kopf.Memo
) -> None:
    """Create or patch each worker group's PodDisruptionBudget; remove those no longer rendered
    (a group gone, or its workers.min now 0)."""
    for budget in desired:
        memo.disruption_budgets.apply(budget, owner_uid=uid)
    wanted = {budget["metadata"]["name"] for budget in desired}
    for stale in set(render.budget_names(name)) - wanted:
        memo.disruption_budgets.delete(stale, namespace, owner_uid=uid)


def _apply(
    name: str,
    namespace: str,
    body: kopf.Body,
    patch: kopf.Patch,
    memo: kopf.Memo,
    follow_live: bool = True,
) -> None:
    """Render and apply. `follow_live`: a change that builds a new RayCluster starts it at the
    replicas serving now (render.starting_at_live_replicas), read from the live service."""
    meta, old = body.get("metadata", {}), body.get("status", {}).get("conditions", [])
    generation = meta.get("generation")
    try:
        spec = parse_spec(dict(body.get("spec") or {}))
        if spec.pods.model_cache_claim:  # its access modes live in the API, not in the spec
            modes = kube.claim_access_modes(spec.pods.model_cache_claim, namespace)
            if problem := render.cache_claim_problem(spec, modes):
                raise SpecError(problem)
        live = live_replicas(name, namespace, spec) if follow_live else {}
        desired, policy, budgets = render.render_owned(
            name, namespace, spec, owner=dict(body), live=live
        )
        # The policy first: Ray pods never run unguarded.
        apply_network_policy(name, namespace, policy, meta.get("uid"), memo)
        apply_budgets(name, namespace, budgets, meta.get("uid"), memo)
        action, current = memo.ray_services.apply(desired, owner_uid=meta.get("uid"))
    except (SpecError, kube.OwnershipError, kube.KubeRayMissing) as err:
        reason = REJECTION_REASONS[type(err)]
        patch.status.update(status.rejected_status(reason, str(err), generation, old, now()))
        kopf.warn(body, reason=reason, message=str(err))
        return
    if action != "unchanged":
        kopf.info(
            body, reason=f"RayService{action.capitalize()}", message=f"RayService {name} {action}"
        )
        if shortfall := surge_shortfall(spec):
            kopf.warn(body, reason="NoGPUForSurge", message=shortfall)
        if unshared := unshared_state(spec):
            kopf.warn(body, reason="StateNotShared", message=unshared)
    patch.status.update(
        status.observed_status(name, namespace, spec, current, None, generation, old, now())
    )


def refused(body: kopf.Body) -> bool:
    """This generation's spec is already reported invalid (Degraded, InvalidSpec): the chart's own
    checks refuse some specs that parse, and only an edit of the spec can change the answer."""
    status = body.get("status") or {}
    if status.get("observedGeneration") != body["metadata"].get("generation"):
        return False
    return any(
        (c.get("type"), c.get("status"), c.get("reason")) == ("Degraded", "True", "InvalidSpec")
        for c in status.get("conditions") or []
    )


def identity(body: kopf.Body) -> tuple[str, str]:
    """The LLMService's name and namespace (it is namespaced: it always has one)."""
    meta = body["metadata"]
    if not meta.get("namespace"):
        raise kopf.PermanentError("an LLMService without a namespace")
    return meta["name"], meta["namespace"]


def reconcile(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Render the RayService and create or patch it (a new resource, or the operator restarted)."""
    _apply(*identity(body), body, patch, memo, follow_live=False)


def reconcile_change(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """A spec change: rendered to start a new RayCluster, if it builds one, at the live replicas."""
    _apply(*identity(body), body, patch, memo)


def delete(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Delete the owned RayService now (the garbage collector would too, later, via the owner
    reference); a RayService this LLMService does not own is left alone."""
    name, namespace = identity(body)
    if memo.ray_services.delete(name, namespace, owner_uid=body["metadata"]["uid"]):
        logger.info(f"deleted RayService {namespace}/{name}")


def follow(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Copy the RayService's state and the platform's queue depth into the status; recreate a
    RayService someone deleted."""
    name, namespace = identity(body)
    try:
        spec = parse_spec(dict(body.get("spec") or {}))
    except SpecError:
        return  # the Degraded condition already says why
    if refused(body):
        return  # not re-rendered (nor warned about) every tick; a RayService running stays
    try:
        rayservice = memo.ray_services.get(name, namespace)
    except kube.KubeRayMissing as err:  # report once; the timer retries until KubeRay exists
        old = dict(body.get("status") or {})
        generation = body["metadata"].get("generation")
        new = status.rejected_status(
            "KubeRayMissing", str(err), generation, old.get("conditions", []), now()
        )
        changes = kube.merge_patch({k: old.get(k) for k in new}, new)
        if changes:
            patch.status.update(changes)
        return
    if rayservice is None:  # recreated: no cluster serves, so none to start from
        _apply(name, namespace, body, patch, memo, follow_live=False)
        return
    if body["metadata"]["uid"] not in kube.owner_uids(rayservice):
        return  # another object's RayService: the RayServiceConflict condition stays
    unknown = status.PlatformLoad(None, None)  # metrics unreachable: say so, keep no stale numbers
    apps = status.vllm_apps(spec.platform)
    load = status.read_load(status.metrics_url(name, namespace), fetch_text, apps) or unknown
    old = dict(body.get("status") or {})
    new = status.observed_status(
        name,
        namespace,
        spec,
        rayservice,
        load,
        body["metadata"].get("generation"),
        old.get("conditions", []),
        now(),
    )
    new = status.keep_last_replicas(new, old, now())
    changes = kube.merge_patch({k: old.get(k) for k in new}, new)
    if changes:  # an unchanged status is not written: no needless watch events
        patch.status.update(changes)


def register(registry: kopf.OperatorRegistry, sync_interval_s: float = SYNC_INTERVAL_S) -> None:
    """Attach the handlers to a registry (tests pass their own, with a short interval)."""
    kopf.on.startup(registry=registry)(configure)
    # kopf and the kubernetes client share one login: in-cluster service account, else kubeconfig.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    for cause in (kopf.on.resume, kopf.on.create):
        cause(*RESOURCE, registry=registry)(reconcile)
    kopf.on.update(*RESOURCE, field="spec", registry=registry)(reconcile_change)
    kopf.on.delete(*RESOURCE, registry=registry)(delete)
    # A failed sync (API or network hiccup) retries at the next tick, not after kopf's 60 s.
    kopf.timer(*RESOURCE, interval=sync_interval_s, backoff=sync_interval_s, registry=registry)(
        follow
    )


register(kopf.get_default_registry())  # what `kopf run -m operators.llmservice` runs
