"""The shipped multi-model example (`serving/examples/multi-model.yaml`) running for this package's
tests (its own Ray head, before the shared platform's), with two tenants beside the default one:
`test_multi_model.py` uses the example as a user would, `test_tenants.py` shares it between
tenants."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
import yaml
from filelock import FileLock

from serving.models import cache_root
from tests.integration.conftest import ROOT, SESSION_LOCK, free_port, run_cli

EXAMPLE = ROOT / "serving" / "examples" / "multi-model.yaml"
GREEDY = {"temperature": 0.0}
METRICS_PORT = free_port()
KEY = "sk-multi-model-test"  # runtime adapters need API keys; the default tenant's
TENANT_KEYS = {
    name: f"sk-{name}-test" for name in ("team-a", "team-b", "team-c", "team-q", "team-k", "ops")
}
# team-a may set vLLM's priority, team-b may not; team-c's usage is compared with the ledger;
# team-q has request and storage limits, team-k a limit on requests in flight; ops reads the
# ledger (admin).
TENANTS = [
    {"name": "team-a", "may_set_priority": True},
    {"name": "team-b"},
    {"name": "team-c"},
    {"name": "team-q", "requests_per_minute": 6, "max_stored_bytes": 3000},
    {"name": "team-k", "max_concurrent_requests": 2},
    {"name": "ops", "admin": True},
]
for entry in TENANTS:
    entry["api_keys"] = [TENANT_KEYS[entry["name"]]]
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="package")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The example's OpenAI base URL while it runs (its own Ray head, before the shared one)."""
    config = yaml.safe_load(EXAMPLE.read_text())
    port = free_port()
    config["http"] = {"port": port, "replica_drain_s": 2}  # one machine (see conftest)
    config["ray"] = {"dashboard_port": free_port(), "metrics_export_port": METRICS_PORT}
    config["auth"] = {"api_keys": [KEY], "tenants": TENANTS}
    for entry in config["models"]:  # the cache this run uses ($LLM_SERVING_CACHE), not ~/.cache
        if entry.get("runtime_adapters"):
            entry["adapter_roots"] = [str(cache_root() / "adapters")]
    path = tmp_path_factory.mktemp("multi-model") / "multi-model.yaml"
    path.write_text(yaml.safe_dump(config))
    with FileLock(str(SESSION_LOCK), timeout=3600), pytest.MonkeyPatch.context() as env:
        env.setenv("OPENAI_API_KEY", KEY)  # for the conformance and bench commands
        started = run_cli("up", "--detach", "--config", str(path))
        if started.returncode != 0:
            run_cli("down")
            pytest.fail(f"llm-serving up failed:\n{started.stdout}\n{started.stderr}")
        try:
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            run_cli("down", timeout=120)


def client(endpoint: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=endpoint, api_key=KEY, max_retries=0)
