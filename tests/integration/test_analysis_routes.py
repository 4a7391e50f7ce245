"""The analysis app through real HTTP under /analysis: real Ray Serve, the tiny Qwen2 loaded with
eager attention (float32, as the test platform serves it)."""

from __future__ import annotations

import httpx
import pytest

FLOAT32_KV_PER_TOKEN = 2 * 2 * 2 * 32 * 4  # K and V x 2 layers x 2 KV heads x head dim 32 x 4 bytes


def test_health(http: httpx.Client) -> None:
    assert http.get("/analysis/health").json() == {"status": "ok", "model": "tiny-qwen2"}


def test_config_reports_architecture_and_counts(http: httpx.Client) -> None:
    response = http.get("/analysis/config")
    assert response.status_code == 200
    body = response.json()
    arch, params = body["architecture"], body["parameters"]
    assert (arch["num_layers"], arch["num_query_heads"], arch["num_kv_heads"]) == (2, 14, 2)
    assert (arch["head_dim"], arch["gqa_group_size"], arch["hidden_size"]) == (32, 7, 448)
    assert arch["tie_word_embeddings"] is True and arch["rope_theta"] == 1_000_000.0
    assert params["embedding"] == 49152 * 448 and params["lm_head_tied"]
    assert params["total"] == params["embedding"] + sum(params["per_layer"]) + params["other"]
    assert body["kv_cache_bytes_per_token"] == FLOAT32_KV_PER_TOKEN
    assert body["config"]["model_type"] == "qwen2"


def test_modules_lists_shapes(http: httpx.Client) -> None:
    rows = {row["name"]: row for row in http.get("/analysis/modules").json()["modules"]}
    assert rows["model.layers.1.self_attn.k_proj"]["weights"] == {"weight": [64, 448], "bias": [64]}
    assert rows["model.layers.1.self_attn"]["type"] == "Qwen2Attention"
    shallow = http.get("/analysis/modules", params={"depth": 1}).json()["modules"]
    assert [row["name"] for row in shallow] == ["(root)", "model", "lm_head"]


def test_attention_layers_show_gqa(http: httpx.Client) -> None:
    layers = http.get("/analysis/attention-layers").json()["layers"]
    assert [x["layer"] for x in layers] == [0, 1]
    assert layers[0]["q_proj"]["weight"] == [448, 448] and layers[0]["k_proj"]["weight"] == [
        64,
        448,
    ]
    assert layers[0]["kv_groups"] == 7 and layers[0]["causal"] is True
    assert layers[0]["scaling"] == pytest.approx(32**-0.5)


def test_kv_cache_math(http: httpx.Client) -> None:
    params = {"tokens": 1000, "batch": 2, "dtype": "bfloat16", "memory_gb": 0.5}
    body = http.get("/analysis/kv-cache", params=params).json()
    assert body["bytes_per_token"] == 2 * 2 * 2 * 32 * 2
    assert body["total_bytes"] == body["bytes_per_token"] * 2000
    assert body["saving"]["factor"] == 7
    assert body["budget"]["tokens_fit"] == (2**30 // 2) // body["bytes_per_token"]
    assert http.get("/analysis/kv-cache").json()["bytes_per_token"] == FLOAT32_KV_PER_TOKEN


def test_attention_weights_json(http: httpx.Client) -> None:
    payload = {"prompt": "The capital of France is", "layers": [0], "heads": [1, 6]}
    body = http.post("/analysis/attention", json=payload).json()
    seq = len(body["tokens"])
    assert body["tokens"][1] == " capital" and (body["layers"], body["heads"]) == ([0], [1, 6])
    for head in body["attention"][0]["heads"]:
        assert len(head["weights"]) == seq
        assert all(sum(row) == pytest.approx(1.0, abs=1e-4) for row in head["weights"])
        assert head["weights"][0][1:] == [0.0] * (seq - 1)  # causal


@pytest.mark.parametrize("where", ["query", "body"])
def test_attention_html_is_bertviz_head_view(http: httpx.Client, where: str) -> None:
    payload = {"prompt": "Paris is lovely", "layers": [1]}
    if where == "query":
        response = http.post("/analysis/attention", params={"format": "html"}, json=payload)
    else:
        response = http.post("/analysis/attention", json={**payload, "format": "html"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    page = response.text
    assert page.startswith("<!DOCTYPE html>") and "bertviz-" in page and "RequireJS 2.3.6" in page
    assert "cdnjs" not in page  # require.js, d3 and jQuery are inlined: no network needed
    assert 'Layer: <select id="layer">' in page and '" lovely"' in page


def test_generation_trace_both_modes(http: httpx.Client) -> None:
    traces = {}
    for mode in ("no-cache", "kv-cache"):
        payload = {"prompt": "The capital of France is", "max_new_tokens": 8, "mode": mode}
        response = http.post("/analysis/generation-trace", json=payload)
        assert response.status_code == 200, response.text
        traces[mode] = response.json()
    for mode, trace in traces.items():
        assert trace["mode"] == mode and len(trace["latencies_ms"]) == 8
        assert all(ms > 0 for ms in trace["latencies_ms"])
        assert trace["growth"]["points"] == 7
        assert isinstance(trace["growth"]["slope_ms_per_token"], float)
    assert traces["no-cache"]["token_ids"] == traces["kv-cache"]["token_ids"]


BAD_INPUTS = [
    ("GET", "/analysis/kv-cache?tokens=0", None, "tokens", "greater than 0"),
    ("GET", "/analysis/kv-cache?tokens=-3", None, "tokens", "greater than 0"),
    ("GET", "/analysis/kv-cache?batch=abc", None, "batch", "valid integer"),
    ("GET", "/analysis/kv-cache?dtype=int4", None, "dtype", "allowed: float32, float16, bfloat16"),
    ("GET", "/analysis/kv-cache?memory_gb=0", None, "memory_gb", "greater than 0"),
    ("POST", "/analysis/attention", {"prompt": "word " * 300}, "prompt", "max_prompt_tokens=256"),
    ("POST", "/analysis/attention", {"prompt": "hi", "layers": [2]}, "layers", "allowed: 0..1"),
    ("POST", "/analysis/attention", {"prompt": "hi", "heads": [14]}, "heads", "allowed: 0..13"),
    (
        "POST",
        "/analysis/attention",
        {"prompt": "hi", "format": "svg"},
        "format",
        "'json' or 'html'",
    ),
    ("POST", "/analysis/attention", {"prompt": ""}, "prompt", "at least 1 character"),
    ("POST", "/analysis/attention", {"text": "hi"}, "prompt", "Field required"),
    (
        "POST",
        "/analysis/generation-trace",
        {"prompt": "hi", "mode": "beam"},
        "mode",
        "'no-cache' or 'kv-cache'",
    ),
    (
        "POST",
        "/analysis/generation-trace",
        {"prompt": "hi", "max_new_tokens": 65},
        "max_new_tokens",
        "limit max_new_tokens=64",
    ),
    (
        "POST",
        "/analysis/generation-trace",
        {"prompt": "hi", "max_new_tokens": 0},
        "max_new_tokens",
        "greater than 0",
    ),
    (
        "POST",
        "/analysis/generation-trace",
        {"prompt": "word " * 300},
        "prompt",
        "max_prompt_tokens=256",
    ),
]


@pytest.mark.parametrize(("method", "path", "payload", "param", "needle"), BAD_INPUTS)
def test_bad_input_is_openai_shaped_4xx(
    http: httpx.Client, method: str, path: str, payload: dict | None, param: str, needle: str
) -> None:
    response = http.request(method, path, json=payload)
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert needle in error["message"] and param in (error["param"] or "")


def test_invalid_json_body_is_400(http: httpx.Client) -> None:
    response = http.post(
        "/analysis/attention", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"


def test_still_serving_after_bad_input(http: httpx.Client) -> None:
    http.get("/analysis/kv-cache", params={"tokens": 0})
    http.post("/analysis/attention", json={"prompt": "hi", "layers": [99]})
    assert http.get("/analysis/health").status_code == 200
    body = http.post("/analysis/attention", json={"prompt": "still here", "layers": [0]}).json()
    assert body["tokens"]
    assert http.get("/health").status_code == 200  # the vLLM app beside it is unaffected
