"""The shipped multi-model example (`llm-serving up --config serving/examples/multi-model.yaml`,
ports moved to free ones): two base models and two LoRA adapters behind one endpoint, used with the
official `openai` client by `model`. Every `llm-serving conformance` case passes through the model
router on the default model; an adapter's greedy output equals transformers + peft on the same
adapter and differs from its base model's. Runtime adapters are on (so API keys are), limited to
the cache's adapters; a replica killed mid-stream ends that stream with an OpenAI error event."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from serving.config import load_config
from serving.config.adapters import DEMO_PREFIX, ensure_demo_adapter
from serving.metrics import ADAPTER_LOADS, counter_values
from serving.models import resolve_model
from tests.integration.conftest import run_cli
from tests.integration.multi_model.conftest import AUTH, EXAMPLE, GREEDY, METRICS_PORT, client


def example_names() -> tuple[list[str], dict[str, str]]:
    """The example's model names, and each adapter's parent."""
    config = load_config(EXAMPLE)
    parents = {a.name: m.name for m in config.models for a in m.adapters}
    return [m.name for m in config.models], parents


def test_models_lists_both_models_and_both_adapters_with_parents(endpoint: str) -> None:
    models, parents = example_names()
    cards = {card.id: getattr(card, "parent", None) for card in client(endpoint).models.list()}
    assert cards == {**{name: None for name in models}, **parents}


def test_every_model_and_adapter_answers_by_name_streaming_too(endpoint: str) -> None:
    models, parents = example_names()
    api = client(endpoint)
    for name in [*models, *parents]:
        completion = api.completions.create(
            model=name, prompt="Hello", max_tokens=4, **GREEDY, extra_body={"ignore_eos": True}
        )
        assert completion.model == name and completion.usage.completion_tokens == 4
        stream = api.chat.completions.create(
            model=name,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
            stream=True,
            extra_body={"ignore_eos": True},
            **GREEDY,
        )
        chunks = [chunk for chunk in stream if chunk.choices]
        assert {chunk.model for chunk in chunks} == {name}
        assert sum(bool(chunk.choices[0].delta.content) for chunk in chunks) >= 2


def test_an_adapter_gives_structured_output_and_logprobs(endpoint: str) -> None:
    _, parents = example_names()
    adapter = sorted(parents)[0]
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    }
    chat = client(endpoint).chat.completions.create(
        model=adapter,
        messages=[{"role": "user", "content": "Name a city as JSON."}],
        max_tokens=40,
        logprobs=True,
        top_logprobs=2,
        **GREEDY,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
    )
    assert set(json.loads(chat.choices[0].message.content)) == {"city"}
    tokens = chat.choices[0].logprobs.content
    assert tokens and all(len(token.top_logprobs) == 2 for token in tokens)


def test_an_unknown_model_is_a_404_naming_the_models(endpoint: str) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        client(endpoint).completions.create(model="no-such-model", prompt="x", max_tokens=1)
    error = raised.value.body
    assert error["code"] == "model_not_found"
    assert all(name in error["message"] for name in example_names()[0])


def peft_greedy(adapter: str, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """Greedy tokens of the default model with the demo adapter, in float32 transformers + peft."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model_dir = resolve_model("default")
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, ensure_demo_adapter(model_dir, adapter)).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=max_tokens,
            do_sample=False,
            min_new_tokens=max_tokens,
        )
    return out[0, len(prompt_ids) :].tolist()


def test_an_adapters_greedy_output_equals_peft_and_differs_from_its_base(endpoint: str) -> None:
    from transformers import AutoTokenizer

    config = load_config(EXAMPLE)
    base = next(m for m in config.models if m.model.ref == "default")
    adapter = base.adapters[0]
    assert adapter.path.startswith(DEMO_PREFIX)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("default"))
    prompt_ids = tokenizer("The three primary colours are")["input_ids"]

    def served(model: str) -> list[int]:
        completion = client(endpoint).completions.create(
            model=model,
            prompt=prompt_ids,
            max_tokens=8,
            **GREEDY,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        return completion.choices[0].model_extra["token_ids"]

    expected = peft_greedy(adapter.path.removeprefix(DEMO_PREFIX), prompt_ids, 8)
    assert served(adapter.name) == expected
    assert served(base.name) != expected


def test_every_conformance_case_passes_through_the_router(endpoint: str, tmp_path: Path) -> None:
    """vLLM's full API (tools, structured outputs, logprobs, echo, Responses, tokenize, ...) on
    the example's default model, dispatched by the router."""
    name = next(m.name for m in load_config(EXAMPLE).models if m.model.ref == "default")
    chat = client(endpoint).chat.completions.create(
        model=name,
        max_tokens=24,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        **GREEDY,
    )
    assert "Paris" in chat.choices[0].message.content
    done = run_cli(
        "conformance",
        "--target",
        f"router={endpoint}",
        "--model",
        name,
        "--output",
        str(tmp_path),
        "--timeout",
        "60",
        timeout=600,
    )
    results = json.loads((tmp_path / "conformance.json").read_text())["results"]
    failing = {r["case"]: r.get("reason") for r in results if r["status"] != "ok"}
    assert len(results) >= 30 and not failing, f"{failing}\n{done.stdout}"
    assert done.returncode == 0, done.stderr


def test_session_routing_keeps_a_session_on_one_replica(endpoint: str) -> None:
    """The example's tiny model has two replicas and session routing: the replica header of a
    session's requests never changes, and sessions spread over both replicas."""
    import httpx

    config = load_config(EXAMPLE)
    entry = next(m for m in config.models if m.routing == "session")
    assert entry.num_replicas == 2
    served: dict[str, set[str]] = {}
    with httpx.Client(timeout=60, headers=AUTH) as http:
        for session in [f"conversation-{i}" for i in range(8)]:
            for turn in range(3):
                response = http.post(
                    f"{endpoint}/completions",
                    headers={"x-session-id": session},
                    json={"model": entry.name, "prompt": f"turn {turn}", "max_tokens": 1},
                )
                assert response.status_code == 200
                served.setdefault(session, set()).add(response.headers["x-llm-serving-replica"])
    assert all(len(replicas) == 1 for replicas in served.values()), served
    assert len(set().union(*served.values())) == 2


def test_a_stored_conversation_chains_across_replicas_and_models(endpoint: str) -> None:
    """Responses stored through the router: a conversation on the two-replica model, each turn in
    a new session (session routing spreads new sessions over both replicas), continues whichever
    replica answers; a GET or DELETE without a model goes to the default model's replica, which
    reads the same store."""
    api = client(endpoint)
    entry = next(m for m in load_config(EXAMPLE).models if m.routing == "session")
    ids: list[str] = []
    served = set()
    for turn in range(4):
        raw = api.responses.with_raw_response.create(
            model=entry.name,
            input=f"Turn {turn}.",
            previous_response_id=ids[-1] if ids else None,
            max_output_tokens=2,
            extra_headers={"x-session-id": f"stored-conversation-{turn}"},
        )
        response = raw.parse()
        assert response.previous_response_id == (ids[-1] if ids else None)
        ids.append(response.id)
        served.add(raw.headers["x-llm-serving-replica"])
    assert len(served) == 2, served
    read = api.responses.with_raw_response.retrieve(ids[-1])  # no model: the default model
    assert read.headers["x-llm-serving-replica"] not in served
    assert read.parse().model == entry.name and read.parse().previous_response_id == ids[-2]
    api.responses.delete(ids[-1])
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(ids[-1])


def adapter_loads() -> dict[str, float]:
    """llm_serving_adapter_loads_total per adapter, summed over replicas, from the Ray node's
    Prometheus endpoint."""
    text = httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).text
    return {
        key[0]: value for key, value in counter_values(text, ADAPTER_LOADS, ("adapter",)).items()
    }


def test_each_adapter_loads_once_into_the_replica_that_serves_it(endpoint: str) -> None:
    """Adapters load when first named (Serve's model multiplexing), then stay: alternating
    requests to both adapters of the one-replica model load each exactly once."""
    _, parents = example_names()
    api = client(endpoint)
    for _ in range(4):
        for adapter in sorted(parents):
            api.completions.create(model=adapter, prompt="Hi", max_tokens=1)
    deadline = time.monotonic() + 30  # Ray exports metrics every 2 s
    while adapter_loads().keys() != parents.keys() and time.monotonic() < deadline:
        time.sleep(1)
    assert adapter_loads() == {adapter: 1.0 for adapter in parents}


def test_status_shows_each_models_app_and_engine(endpoint: str) -> None:
    done = run_cli("status")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for name in example_names()[0]:
        at = lines.index(f"vllm-{name}: RUNNING")
        assert any(line.strip().startswith("engine: ok") for line in lines[at : at + 4]), (
            done.stdout
        )


def test_the_load_generator_mixes_models_and_reports_each(endpoint: str, tmp_path: Path) -> None:
    models, parents = example_names()
    mix = ",".join(f"{name}=1" for name in [*models, *parents])
    done = run_cli(
        "bench",
        "sweep",
        "--target",
        f"router={endpoint}",
        "--model-mix",
        mix,
        "--concurrency",
        "4",
        "--requests",
        "16",
        "--rounds",
        "1",
        "--input-len",
        "16",
        "--output-len",
        "4",
        "--output",
        str(tmp_path),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "result.json").read_text())["levels"][0]["results"]["router"]
    per_model = result["per_model"]
    assert set(per_model) <= {*models, *parents} and len(per_model) >= 3
    assert sum(m["completed"] for m in per_model.values()) == result["completed"] == 16
    assert "## Per model" in (tmp_path / "summary.md").read_text()


def test_an_adapter_loaded_at_run_time_is_served_until_unloaded(endpoint: str) -> None:
    """vLLM's load/unload routes on the endpoint (the example's tiny model allows them): a bad
    path is refused before the name is served; a good one answers on both replicas (sessions
    spread over them, each loads it from the path the router passes), then is gone."""
    config = load_config(EXAMPLE)
    tiny = next(m for m in config.models if m.runtime_adapters)
    path = ensure_demo_adapter(resolve_model(tiny.model.ref), "tiny-runtime")
    bad = httpx.post(
        f"{endpoint}/load_lora_adapter",
        timeout=60,
        headers=AUTH,
        json={"lora_name": "tiny-bad", "lora_path": str(path.parent / "nonexistent")},
    )
    assert bad.status_code == 400 and "could not be loaded" in bad.json()["error"]["message"]
    loaded = httpx.post(
        f"{endpoint}/load_lora_adapter",
        timeout=60,
        headers=AUTH,
        json={"lora_name": "tiny-runtime", "lora_path": str(path)},
    )
    assert loaded.status_code == 200, loaded.text
    api = client(endpoint)
    replicas = set()
    for session in map(str, range(8)):
        response = api.completions.with_raw_response.create(
            model="tiny-runtime", prompt="Hi", max_tokens=2, user=session
        )
        assert response.parse().model == "tiny-runtime"
        replicas.add(response.headers["x-llm-serving-replica"])
    assert len(replicas) == 2
    cards = {card.id: getattr(card, "parent", None) for card in api.models.list()}
    assert cards["tiny-runtime"] == tiny.name and "tiny-bad" not in cards
    unloaded = httpx.post(
        f"{endpoint}/unload_lora_adapter", headers=AUTH, json={"lora_name": "tiny-runtime"}
    )
    assert unloaded.status_code == 200
    with pytest.raises(openai.NotFoundError):
        api.completions.create(model="tiny-runtime", prompt="Hi", max_tokens=2)


def test_runtime_adapters_load_only_from_the_roots_and_only_through_the_router(
    endpoint: str, tmp_path: Path
) -> None:
    """A path outside the model's adapter_roots (or a link out of one) is refused naming the
    setting, as are load_inplace and a load without a key; SageMaker's /adapters route, which
    vLLM adds with its own load route, is not reachable; no model card shows a server path.
    (Before adapter_roots, the copy outside the cache loaded: 200.)"""
    config = load_config(EXAMPLE)
    tiny = next(m for m in config.models if m.runtime_adapters)
    inside = ensure_demo_adapter(resolve_model(tiny.model.ref), "tiny-roots")
    outside = tmp_path / "outside"
    shutil.copytree(inside, outside)
    link = inside.parent / "tiny-link-out"
    link.unlink(missing_ok=True)
    link.symlink_to(outside)

    def load(body: dict, headers: dict[str, str] = AUTH) -> httpx.Response:
        return httpx.post(f"{endpoint}/load_lora_adapter", json=body, headers=headers, timeout=60)

    try:
        for path in (outside, link):
            refused = load({"lora_name": "tiny-outside", "lora_path": str(path)})
            assert refused.status_code == 400, refused.text
            assert "adapter_roots" in refused.json()["error"]["message"]
    finally:
        link.unlink()
    inplace = load({"lora_name": "tiny-roots", "lora_path": str(inside), "load_inplace": True})
    assert inplace.status_code == 400 and "load_inplace" in inplace.json()["error"]["message"]
    keyless = load({"lora_name": "tiny-roots", "lora_path": str(inside)}, headers={})
    assert keyless.status_code == 401
    origin = endpoint.removesuffix("/v1")
    sagemaker = httpx.post(
        f"{origin}/adapters",
        headers=AUTH,
        timeout=60,
        json={"model": tiny.name, "name": "tiny-sagemaker", "src": str(outside)},
    )
    assert (
        sagemaker.status_code == 404 and "runtime_adapters" in sagemaker.json()["error"]["message"]
    )
    cards = list(client(endpoint).models.list())
    assert "tiny-outside" not in {card.id for card in cards}
    assert not [card.root for card in cards if card.root and card.root.startswith(("/", "demo:"))]


def replica_processes(app: str) -> list[psutil.Process]:
    """The worker processes of an app's VLLMServer replicas (Ray titles them by actor class)."""
    title = f"ServeReplica:{app}:VLLMServer"
    return [
        process
        for process in psutil.process_iter(["cmdline"])
        if any(title in part for part in process.info["cmdline"] or [])
    ]


def test_a_batch_runs_lines_of_every_model_and_adapter_on_their_replicas(endpoint: str) -> None:
    """The Batch API behind the router: one batch naming both models and both adapters; each
    line runs on its model's replicas (the adapter loaded there) and answers as its model."""
    models, parents = example_names()
    names = models + sorted(parents)
    message = [{"role": "user", "content": "Hello"}]
    rows = [
        {
            "custom_id": f"{name}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": name, "messages": message, "max_tokens": 2},
        }
        for name in names
        for i in range(2)
    ]
    api = client(endpoint)
    content = "".join(json.dumps(row) + "\n" for row in rows).encode()
    file = api.files.create(file=("models.jsonl", content), purpose="batch")
    batch = api.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="1h"
    )
    for _ in range(600):  # bounded: 5 minutes
        batch = api.batches.retrieve(batch.id)
        if batch.status not in ("in_progress", "finalizing"):
            break
        time.sleep(0.5)
    assert batch.status == "completed" and batch.output_file_id, batch
    lines = [json.loads(row) for row in api.files.content(batch.output_file_id).text.splitlines()]
    answered = {line["custom_id"]: line["response"]["body"]["model"] for line in lines}
    assert answered == {row["custom_id"]: row["body"]["model"] for row in rows}


def test_a_replica_killed_mid_stream_ends_its_stream_with_an_openai_error(endpoint: str) -> None:
    """Every replica of a model dies (SIGKILL, as the OOM killer) while a stream runs on each:
    the official client gets an OpenAI error, not a cut connection; the raw stream ends with the
    error event and `[DONE]`; a request sent after is served once Serve restarts a replica.
    Last in the module: it waits until both replicas serve again. (Before, the router passed
    the handle's error on and the connection was cut: httpx.RemoteProtocolError.)"""
    config = load_config(EXAMPLE)
    tiny = next(m for m in config.models if m.routing == "session")
    body = {
        "model": tiny.name,
        "prompt": "Count",
        "max_tokens": 400,
        "stream": True,
        "ignore_eos": True,
    }
    api = client(endpoint)
    with httpx.Client(timeout=120, headers=AUTH) as http:
        with http.stream("POST", f"{endpoint}/completions", json=body) as raw:
            lines = raw.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            official = api.completions.create(
                model=tiny.name,
                prompt="Count",
                max_tokens=400,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            next(iter(official))
            processes = replica_processes(tiny.app_name)
            assert len(processes) == tiny.num_replicas
            for process in processes:
                os.kill(process.pid, signal.SIGKILL)
            rest = [line for line in lines if line]
        with pytest.raises(openai.APIError) as raised:
            for _ in official:
                pass
    assert not isinstance(raised.value, openai.APIConnectionError)
    assert "replica" in raised.value.message
    assert rest[-1] == "data: [DONE]", rest[-3:]
    error = json.loads(rest[-2].removeprefix("data: "))["error"]
    assert error["code"] == "replica_failed" and tiny.name in error["message"]
    # Serve restarts the replicas: until one serves, a request is a 503 in OpenAI's shape
    served: set[str] = set()
    deadline = time.monotonic() + 300
    while len(served) < tiny.num_replicas and time.monotonic() < deadline:
        try:  # session routing sends a new session to the replica with the fewest
            response = api.with_options(timeout=120).completions.with_raw_response.create(
                model=tiny.name, prompt="Hi", max_tokens=1, user=f"after-{time.monotonic()}"
            )
        except openai.InternalServerError as err:
            assert err.status_code == 503 and err.body["code"] == "replica_failed"
            time.sleep(1)
            continue
        assert response.parse().usage.completion_tokens == 1
        served.add(response.headers["x-llm-serving-replica"])
        time.sleep(0.5)
    assert len(served) == tiny.num_replicas
