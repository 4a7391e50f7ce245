"""A replica's `vllm serve` options: the typed fields and `vllm.args` become one mapping that
vLLM's own parser reads; what vLLM refuses is a config error with vLLM's message."""

from __future__ import annotations

import pytest

from serving.config import ConfigError, parse_config
from serving.engines.vllm_args import (
    ServerArgsError,
    check_server_args,
    engine_options,
    server_namespace,
    server_options,
)


def config(args: dict | None = None, **limits):
    return parse_config({"vllm": {"args": args or {}}, "limits": limits})


def test_typed_fields_and_free_options_reach_vllms_namespace() -> None:
    ns = server_namespace(
        config(
            {
                "enable_auto_tool_choice": True,
                "tool-call-parser": "hermes",
                "enable_prefix_caching": False,
                "max_logprobs": 5,
            }
        ),
        "/m",
    )
    assert (ns.model, ns.served_model_name, ns.max_model_len) == ("/m", ["default"], 2048)
    assert ns.enable_auto_tool_choice and ns.tool_call_parser == "hermes"
    assert ns.enable_prefix_caching is False  # `false` becomes vLLM's --no-... flag
    assert ns.max_logprobs == 5
    assert ns.distributed_executor_backend == "uni"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"enable_auto_tool_choise": True}, "unrecognized arguments: --enable-auto-tool-choise"),
        (
            {"enable_auto_tool_choice": True},
            "--enable-auto-tool-choice requires --tool-call-parser",
        ),
        ({"max_logprobs": "many"}, "argument --max-logprobs: invalid int value: 'many'"),
        (
            {"enable_auto_tool_choice": True, "tool_call_parser": "nope"},
            "invalid tool call parser: nope",
        ),
    ],
)
def test_vllm_refuses_what_vllm_serve_refuses_with_its_message(args: dict, message: str) -> None:
    with pytest.raises(ServerArgsError, match="vllm.args: vLLM refused the options") as err:
        check_server_args(config(args))
    assert message in str(err.value)
    assert isinstance(err.value, ConfigError)  # `llm-serving up` prints it as one error line


@pytest.mark.parametrize(
    ("key", "why"),
    [("dtype", "typed field"), ("model", "the platform"), ("tensor-parallel-size", "the platform")],
)
def test_an_option_set_twice_or_owned_by_the_platform_is_refused(key: str, why: str) -> None:
    with pytest.raises(ConfigError, match=f"vllm.args.{key.replace('-', '_')}: .*{why}"):
        server_options(config({key: 1}), "/m")


def test_the_max_tokens_limit_caps_vllms_default_max_tokens() -> None:
    options = server_options(config(max_tokens=64), "/m")
    assert options["override_generation_config"] == {"max_new_tokens": 64}
    mine = server_options(
        config(
            {"override_generation_config": {"max_new_tokens": 500, "temperature": 0.2}},
            max_tokens=64,
        ),
        "/m",
    )
    assert mine["override_generation_config"] == {"max_new_tokens": 64, "temperature": 0.2}


def test_the_offline_engine_gets_only_engine_options() -> None:
    options = engine_options(
        config(
            {
                "enable_auto_tool_choice": True,
                "tool_call_parser": "hermes",
                "enable_prefix_caching": True,
            }
        ),
        "/m",
    )
    assert options["enable_prefix_caching"] is True
    assert "tool_call_parser" not in options and "enable_auto_tool_choice" not in options
