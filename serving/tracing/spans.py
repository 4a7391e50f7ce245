"""The spans of one request and their attributes: the contract between what the router and the
replicas write and what the console's requests view and `llm-serving trace` read back.

A request through the model router is one trace:
    router.request                   the router's HTTP request (SERVER)
      router.routing_decision        the request router's choice: policy, replica, why
      replica.request                the replica's HTTP request (SERVER, another process)
        replica.serve_queue          from the router's hand-off to the replica taking it
        llm_request                  vLLM's engine span: queue, prefill, decode, tokens
A request straight to a model's app (no router) starts at replica.request. A client's
`traceparent` makes the first span the child of the client's."""

from __future__ import annotations

ROUTER_REQUEST = "router.request"
ROUTING_DECISION = "router.routing_decision"
REPLICA_REQUEST = "replica.request"
SERVE_QUEUE = "replica.serve_queue"
ENGINE_REQUEST = "llm_request"  # vLLM's own (vllm/v1/engine/output_processor.py)

# OpenTelemetry's HTTP semantic conventions.
HTTP_METHOD = "http.request.method"
URL_PATH = "url.path"
HTTP_STATUS = "http.response.status_code"

# The platform's own.
COMPONENT = "llm_serving.component"  # router | replica
MODEL = "llm_serving.model"
REPLICA = "llm_serving.replica"  # Serve's replica id (unique_id)
REQUEST_ID = "llm_serving.request_id"  # the client's X-Request-Id, when it sent one
ROUTING_POLICY = "llm_serving.routing.policy"
ROUTING_REASON = "llm_serving.routing.reason"  # one line: why this replica
ROUTING_CANDIDATES = "llm_serving.routing.candidates"
ROUTING_QUEUED_S = "llm_serving.routing.queued_s"  # waited in the router for a free replica
ROUTING_PREFIX_MATCH = "llm_serving.routing.prefix_match_chars"
ROUTING_LOAD_SCORE = "llm_serving.routing.load_score"
ROUTING_SESSION = "llm_serving.routing.session"
ROUTING_ADAPTER = "llm_serving.routing.adapter"

# vLLM's engine span (vllm.tracing.SpanAttributes), read back by the timelines.
ENGINE_REQUEST_ID = "gen_ai.request.id"  # the response's `id` (chatcmpl-..., cmpl-...)
ENGINE_QUEUE_S = "gen_ai.latency.time_in_queue"
ENGINE_PREFILL_S = "gen_ai.latency.time_in_model_prefill"
ENGINE_DECODE_S = "gen_ai.latency.time_in_model_decode"
ENGINE_TTFT_S = "gen_ai.latency.time_to_first_token"
ENGINE_E2E_S = "gen_ai.latency.e2e"
ENGINE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
ENGINE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"

# Set by the router on the request it hands to a replica (ns since the epoch), so the replica
# can show the time the request spent queued in Serve between the two processes.
FORWARDED_AT_HEADER = b"x-llm-serving-forwarded-at"
