"""serving.analysis against numbers computed by hand: Qwen2.5-0.5B from the shipped config (meta
device, no weights), KV-cache arithmetic, and the tiny Qwen2's attention and latency (real model)."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from importlib import resources

import pytest
import torch
from fastapi.testclient import TestClient

from serving.analysis import AnalysisInputError
from serving.analysis.architecture import (
    attention_layers,
    config_report,
    load_model_config,
    meta_model,
    module_tree,
)
from serving.analysis.attention import attention_report, load_analysis_model
from serving.analysis.kv_cache import GIB, kv_bytes_per_token, kv_cache_report
from serving.analysis.latency import fit_growth, generation_trace
from serving.config import AnalysisDeploymentConfig
from serving.deployments.analysis import build_analysis_api
from serving.models import resolve_model

QWEN_CONFIG = resources.files("serving").joinpath("data/qwen2.5-0.5b-config.json")
# By hand: q 896*896+896, k and v 128*896+128 each, o 896*896, MLP 3*896*4864, two norms of 896.
QWEN_LAYER = (896 * 896 + 896) + 2 * (128 * 896 + 128) + 896 * 896 + 3 * 896 * 4864 + 2 * 896
QWEN_EMBEDDING = 151936 * 896


@pytest.fixture(scope="module")
def qwen() -> torch.nn.Module:
    return meta_model(load_model_config(str(QWEN_CONFIG)))


@pytest.fixture(scope="module")
def tiny() -> tuple:
    return load_analysis_model(resolve_model("tiny-qwen2"), "float32")


def test_qwen25_parameter_count_matches_model_card(qwen: torch.nn.Module) -> None:
    params = config_report(qwen)["parameters"]
    assert params["total"] == 494_032_768
    assert params["embedding"] == QWEN_EMBEDDING
    assert params["lm_head_tied"] and params["lm_head"] == 0
    assert params["per_layer"] == [QWEN_LAYER] * 24
    assert params["other"] == 896  # the final RMSNorm
    assert QWEN_EMBEDDING + 24 * QWEN_LAYER + 896 == 494_032_768


def test_qwen25_architecture_summary(qwen: torch.nn.Module) -> None:
    report = config_report(qwen)
    assert report["architecture"] == {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 896,
        "num_layers": 24,
        "num_query_heads": 14,
        "num_kv_heads": 2,
        "head_dim": 64,
        "gqa_group_size": 7,
        "intermediate_size": 4864,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": True,
        "dtype": "bfloat16",
    }
    assert report["kv_cache_bytes_per_token"] == 12_288
    assert report["config"]["num_hidden_layers"] == 24


def test_qwen25_attention_layers_show_gqa(qwen: torch.nn.Module) -> None:
    layers = attention_layers(qwen)
    assert [x["layer"] for x in layers] == list(range(24))
    first = layers[0]
    assert first["q_proj"] == {"weight": [896, 896], "bias": True}
    assert first["k_proj"] == first["v_proj"] == {"weight": [128, 896], "bias": True}
    assert first["o_proj"] == {"weight": [896, 896], "bias": False}
    assert (first["num_query_heads"], first["num_kv_heads"], first["kv_groups"]) == (14, 2, 7)
    assert first["scaling"] == pytest.approx(64**-0.5)
    assert first["causal"] is True


def test_module_tree_lists_types_counts_and_shapes(qwen: torch.nn.Module) -> None:
    rows = {row["name"]: row for row in module_tree(qwen)}
    k_proj = rows["model.layers.0.self_attn.k_proj"]
    assert k_proj["type"] == "Linear" and k_proj["depth"] == 5
    assert k_proj["weights"] == {"weight": [128, 896], "bias": [128]}
    assert k_proj["parameters"] == 128 * 896 + 128
    assert rows["model.layers.23"]["parameters"] == QWEN_LAYER
    assert max(row["depth"] for row in module_tree(qwen, max_depth=2)) == 2


def test_kv_bytes_per_token_by_hand() -> None:
    assert kv_bytes_per_token(24, 2, 64, "bfloat16") == 2 * 24 * 2 * 64 * 2 == 12_288
    assert kv_bytes_per_token(24, 2, 64, "float32") == 24_576
    assert kv_bytes_per_token(24, 2, 64, "bf16") == kv_bytes_per_token(24, 2, 64, "float16")


def test_kv_cache_report_totals_saving_and_budget() -> None:
    report = kv_cache_report(24, 14, 2, 64, "bfloat16", tokens=1000, batch=3, memory_gb=2)
    assert report["total_bytes"] == 12_288 * 1000 * 3
    assert report["mha"]["bytes_per_token"] == 2 * 24 * 14 * 64 * 2 == 86_016
    assert report["saving"]["factor"] == 7
    assert report["saving"]["bytes"] == (86_016 - 12_288) * 3000
    assert report["budget"]["tokens_fit"] == 2 * GIB // 12_288
    assert report["budget"]["sequences_fit"] == 2 * GIB // (12_288 * 1000)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"tokens": 0}, "tokens"),
        ({"tokens": 8, "batch": -1}, "batch"),
        ({"tokens": 8, "memory_gb": 0}, "memory_gb"),
        ({"tokens": 8, "dtype": "int3"}, "dtype"),
    ],
)
def test_kv_cache_report_rejects_bad_input(kwargs: dict, param: str) -> None:
    args = {"dtype": "bfloat16", **kwargs}
    with pytest.raises(AnalysisInputError) as err:
        kv_cache_report(24, 14, 2, 64, **args)
    assert err.value.param == param
    if param == "dtype":
        assert "allowed: float32, float16, bfloat16" in err.value.message


def test_tiny_attention_weights_shape_and_rows_sum_to_one(tiny: tuple) -> None:
    model, tokenizer = tiny
    report = attention_report(
        model, tokenizer, "The capital of France is", layers=[1], heads=[0, 13]
    )
    seq = len(report["tokens"])
    assert report["tokens"][1] == " capital" and seq == len(report["token_ids"])
    assert (report["num_layers"], report["num_heads"], report["layers"]) == (2, 14, [1])
    weights = torch.tensor([h["weights"] for h in report["attention"][0]["heads"]])
    assert weights.shape == (2, seq, seq)
    assert torch.allclose(weights.sum(-1), torch.ones(2, seq), atol=1e-4)
    assert torch.all(weights.triu(diagonal=1) == 0)  # causal: no query sees a later key


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"layers": [2]}, "unknown layer index 2; allowed: 0..1"),
        ({"heads": [14]}, "unknown head index 14; allowed: 0..13"),
        ({"max_prompt_tokens": 2}, "max_prompt_tokens=2"),
        ({"max_values": 10}, "max_attention_values=10"),
        ({"fmt": "svg"}, "allowed: json, html"),
    ],
)
def test_tiny_attention_rejects_bad_selection(tiny: tuple, kwargs: dict, needle: str) -> None:
    with pytest.raises(AnalysisInputError, match=needle.replace("^", r"\^")):
        attention_report(*tiny, "The capital of France is", **kwargs)


def test_tiny_head_view_is_bertviz_page_with_tokens(tiny: tuple) -> None:
    page = attention_report(*tiny, "Paris is lovely", fmt="html")
    assert page.startswith("<!DOCTYPE html>")
    assert (
        "bertviz-" in page and "require.js" in page and "head_view" not in page.split("<body>")[0]
    )
    assert '" lovely"' in page  # the tokens travel in the view's parameters


def test_fit_growth_recovers_a_line() -> None:
    fit = fit_growth([10, 11, 12, 13], [5.0, 7.0, 9.0, 11.0])
    assert fit["slope_ms_per_token"] == pytest.approx(2.0)
    assert fit["intercept_ms"] == pytest.approx(-15.0)
    assert fit_growth([10], [1.0])["slope_ms_per_token"] is None


@pytest.fixture
def one_thread() -> Iterator[None]:
    # On a busy 2-core machine two intra-op threads wait on each other when either is preempted
    # (steps jump 15 -> 150 ms); one thread measures the model, not the neighbours.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("one_thread")
def test_no_cache_steps_cost_more_than_cached_steps(tiny: tuple) -> None:
    # A long context makes re-computation dominate; compared within one run, on medians, so a busy
    # machine slows both alike. The growth per token is a benchmark figure (`analyze trace`).
    model, tokenizer = tiny
    prompt, steps = "hello " * 200, 12
    no_cache = generation_trace(model, tokenizer, prompt, steps, "no-cache")["latencies_ms"]
    cached = generation_trace(model, tokenizer, prompt, steps, "kv-cache")["latencies_ms"]
    assert statistics.median(no_cache[1:]) > statistics.median(cached[1:])


def test_kv_cache_trace_matches_no_cache_tokens(tiny: tuple) -> None:
    no_cache = generation_trace(*tiny, "The capital of France is", 6, "no-cache")
    cached = generation_trace(*tiny, "The capital of France is", 6, "kv-cache")
    assert cached["token_ids"] == no_cache["token_ids"]  # same greedy tokens, only the cost differs
    assert len(cached["latencies_ms"]) == 6 and cached["growth"]["points"] == 5


@pytest.mark.parametrize(
    ("args", "param"),
    [
        ((4, "beam"), "mode"),
        ((0, "kv-cache"), "max_new_tokens"),
        ((9, "kv-cache"), "max_new_tokens"),
    ],
)
def test_trace_rejects_bad_input(tiny: tuple, args: tuple, param: str) -> None:
    with pytest.raises(AnalysisInputError) as err:
        generation_trace(*tiny, "hi", *args, max_new_tokens_limit=8)
    assert err.value.param == param


@pytest.fixture(scope="module")
def api(tiny: tuple) -> TestClient:
    settings = AnalysisDeploymentConfig(max_prompt_tokens=16, max_new_tokens=4)
    return TestClient(build_analysis_api(*tiny, settings, "tiny-qwen2", default_tokens=1024))


def test_api_kv_cache_defaults_to_served_dtype_and_context(api: TestClient) -> None:
    body = api.get("/kv-cache").json()
    assert (body["tokens"], body["dtype"]) == (1024, "float32")  # the dtype the model runs in
    assert body["bytes_per_token"] == 2 * 2 * 2 * 32 * 4
    assert api.get("/kv-cache?dtype=bf16").json()["bytes_per_token"] == 2 * 2 * 2 * 32 * 2


@pytest.mark.parametrize(
    ("method", "path", "payload", "needle"),
    [
        ("get", "/kv-cache?tokens=0", None, "greater than 0"),
        ("get", "/kv-cache?dtype=int4", None, "allowed:"),
        ("post", "/attention", {"prompt": "a " * 40}, "max_prompt_tokens=16"),
        ("post", "/attention", {"prompt": "hi", "layers": [7]}, "allowed: 0..1"),
        ("post", "/generation-trace", {"prompt": "hi", "mode": "beam"}, "'no-cache' or 'kv-cache'"),
        ("post", "/generation-trace", {"prompt": "hi", "max_new_tokens": 5}, "max_new_tokens=4"),
    ],
)
def test_api_bad_input_is_openai_shaped_400(
    api: TestClient, method: str, path: str, payload: dict | None, needle: str
) -> None:
    response = api.request(method.upper(), path, json=payload)
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and needle in error["message"]
    assert api.get("/health").json()["status"] == "ok"
