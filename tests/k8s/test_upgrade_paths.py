"""The chart README's upgrade-path table is computed (serving/k8s/upgrade_catalogue.py): a
template change that moves a value to another path fails here until the table is regenerated.
The pinned cases say what the table must keep saying; the KubeRay hash is checked on small specs
against what KubeRay 1.7's utils/util.go mutes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from serving.config import PlatformConfig
from serving.k8s import upgrade_catalogue as catalogue
from serving.k8s import upgrade_table
from serving.k8s.upgrade_paths import (
    Outcome,
    UpgradePath,
    classify,
    cluster_action,
    freeze,
    kuberay_cluster_hash,
    rayservice,
    rendered_objects,
)

REGENERATE = "run `llm-serving render upgrade-paths` (or `make render`)"
WORKER_SCALING = "llm-serving.io/worker-scaling"


@pytest.fixture(scope="module")
def results() -> list[catalogue.Classified]:
    return catalogue.classified_catalogue()


@pytest.mark.parametrize("page", upgrade_table.PAGES, ids=lambda page: page.name)
def test_the_readme_table_is_the_computed_one(
    results: list[catalogue.Classified], page: Path
) -> None:
    block = upgrade_table.BLOCK.search(page.read_text())
    assert block, f"{page} lost its <!-- upgrade-paths:start/end --> block"
    written = block.group(0).removeprefix(block.group(1)).removesuffix(block.group(2))
    assert written == upgrade_table.upgrade_table(results), REGENERATE


def test_every_change_renders(results: list[catalogue.Classified]) -> None:
    """A value whose derived change the chart rejects needs an entry in OVERRIDES or CONTEXTS."""
    failed = {r.path: r.reason for r in results if not r.outcome}
    assert failed.keys() == catalogue.NOT_RENDERED.keys(), failed


def test_the_catalogue_has_every_value_and_platform_field() -> None:
    paths = [change.path for change in catalogue.catalogue()]
    tops = {path.split(".")[0] for path in paths}
    assert tops == set(catalogue.defaults()) - {"global"}
    for section, field in PlatformConfig.model_fields.items():
        subfields = getattr(field.annotation, "model_fields", {})
        for name in subfields or [""]:
            prefix = f"platform.{section}.{name}".rstrip(".")
            assert any(p == prefix or p.startswith(prefix + ".") for p in paths), prefix


def change(path: str, value: Any, context: dict[str, Any] | None = None) -> Outcome:
    before = context or {}
    return classify(before, catalogue._merged(before, catalogue.nested(path, value)))


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        # Autoscaling bounds are deployment options: Serve keeps the replicas.
        ("platform.vllm.autoscaling.max_replicas", 3, Outcome(UpgradePath.SERVE_IN_PLACE)),
        ("platform.vllm.engine.max_num_seqs", 64, Outcome(UpgradePath.APP_ROLLED, ("vllm",))),
        # Serve hashes whether a deployment autoscales into the code version.
        ("platform.hf.autoscaling", {"max_replicas": 2}, Outcome(UpgradePath.APP_ROLLED, ("hf",))),
        ("platform.hf.enabled", False, Outcome(UpgradePath.APP_ADDED_REMOVED, ("hf",))),
        ("image.tag", "next", Outcome(UpgradePath.NEW_CLUSTER)),
        # The prefetch init container lists the models: not only the apps' args.
        ("platform.model.ref", "Qwen/Qwen2.5-1.5B", Outcome(UpgradePath.NEW_CLUSTER)),
        ("workers.gpu.maxReplicas", 8, Outcome(UpgradePath.NEW_CLUSTER)),
        # KubeRay 1.7 mutes every pod's tolerations; the chart's annotation covers only workers.
        ("head.tolerations", [catalogue.TOLERATION], Outcome(UpgradePath.IGNORED_BY_KUBERAY)),
        ("networkPolicy.enabled", False, Outcome(UpgradePath.OUTSIDE_RAY)),
        ("platform.ray.num_cpus", 4, Outcome(UpgradePath.NOTHING)),
        ("fullnameOverride", "other", Outcome(UpgradePath.RAYSERVICE_REPLACED)),
    ],
)
def test_pinned_paths(path: str, value: Any, expected: Outcome) -> None:
    assert change(path, value) == expected


def test_worker_scaling_takes_the_new_cluster_path_through_the_chart_annotation() -> None:
    """KubeRay alone would ignore maxReplicas: with the head's annotation muted the hash is equal."""
    specs = [
        copy.deepcopy(rayservice(rendered_objects(freeze(values)))["spec"]["rayClusterConfig"])
        for values in ({}, {"workers": {"gpu": {"maxReplicas": 8}}})
    ]
    for spec in specs:
        del spec["headGroupSpec"]["template"]["metadata"]["annotations"][WORKER_SCALING]
    assert cluster_action(*specs) is None


def pod(**spec: Any) -> dict[str, Any]:
    return {"template": {"metadata": {}, "spec": {"containers": [{"image": "ray"}], **spec}}}


def cluster(*groups: dict[str, Any], **fields: Any) -> dict[str, Any]:
    head = {"rayStartParams": {}, **pod()}
    workers = [
        {"groupName": f"g{i}", "rayStartParams": {}, **pod(), **g} for i, g in enumerate(groups)
    ]
    return {"headGroupSpec": head, "workerGroupSpecs": workers, **fields}


@pytest.mark.parametrize(
    "muted",
    [
        cluster({"replicas": 3, "minReplicas": 1, "maxReplicas": 9}),
        cluster({"scaleStrategy": {"workersToDelete": ["pod-a"]}}),
        cluster(pod(tolerations=[{"key": "k"}], schedulingGates=[{"name": "kueue"}])),
        cluster({}, suspend=True, upgradeStrategy={"type": "Recreate"}),
    ],
)
def test_the_kuberay_hash_mutes_what_kuberay_mutes(muted: dict[str, Any]) -> None:
    assert kuberay_cluster_hash(muted) == kuberay_cluster_hash(cluster({}))


@pytest.mark.parametrize(
    "counted",
    [
        cluster({"rayStartParams": {"num-cpus": "2"}}),
        cluster({"groupName": "other"}),
        cluster({}, rayVersion="2.61.0"),
        cluster(pod(nodeSelector={"gpu": "h100"})),
    ],
)
def test_the_kuberay_hash_counts_the_rest(counted: dict[str, Any]) -> None:
    assert kuberay_cluster_hash(counted) != kuberay_cluster_hash(cluster({}))


def test_kuberay_updates_in_place_only_for_worker_groups_appended() -> None:
    one, two = cluster({}), cluster({}, {"rayStartParams": {"num-cpus": "1"}})
    assert cluster_action(one, two) is UpgradePath.CLUSTER_UPDATED
    assert cluster_action(two, one) is UpgradePath.NEW_CLUSTER
    assert cluster_action(one, cluster({"replicas": 5})) is None


def test_a_models_engine_change_rolls_that_models_app(results: list[catalogue.Classified]) -> None:
    (result,) = [r for r in results if r.path == "platform.models[].engine.max_num_seqs"]
    assert result.outcome and result.outcome.path is UpgradePath.APP_ROLLED
    assert "vllm-<name>" in result.outcome.apps
