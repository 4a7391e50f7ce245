"""operators.crd: the committed CRD is generated from the spec models, structural, with the
printer columns, and a valid Kubernetes object."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from operators import crd


def test_committed_crd_is_generated_from_the_models() -> None:
    assert crd.check_or_write(crd.CRD_PATH, check=True) is None


def test_crd_is_structural_and_shows_the_columns() -> None:
    manifest = crd.crd_manifest()
    version = manifest["spec"]["versions"][0]
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["Model", "Ready", "Models", "Replicas", "Queue", "Age"]
    assert version["subresources"] == {"status": {}}

    def untyped(node: Any, path: str) -> list[str]:
        if not isinstance(node, dict):
            return []
        found = [] if "type" in node or node.get("x-kubernetes-int-or-string") else [path]
        for key in ("properties", "additionalProperties", "items"):
            child = node.get(key)
            if not isinstance(child, dict):
                continue
            children = child.items() if key == "properties" else [(key, child)]
            for name, sub in children:
                found += untyped(sub, f"{path}.{name}")
        return found

    schema = version["schema"]["openAPIV3Schema"]
    assert untyped(schema, "") == []
    platform = schema["properties"]["spec"]["properties"]["platform"]
    assert platform["properties"]["vllm"]["properties"]["autoscaling"]["nullable"] is True
    assert "$ref" not in yaml.safe_dump(manifest)


def test_crd_is_a_valid_kubernetes_object() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(crd.crd_manifest(), "1.33", strict=True)
