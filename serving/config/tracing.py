"""Where the platform's OpenTelemetry traces go: the `tracing` part of PlatformConfig, read by the
model router, every vLLM replica (its own spans and vLLM's engine span) and the analysis
console's requests view. Off (no endpoint) by default: then nothing is traced or imported."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from serving.config.replica import StrictModel

OtlpProtocol = Literal["http/protobuf", "grpc"]


def _http_url(value: str | None, field: str) -> str | None:
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"{field} must be an http(s) URL, e.g. http://127.0.0.1:6006, not {value!r}"
        )
    return value.rstrip("/")


class TracingConfig(StrictModel):
    """One trace per request, joined across the router, the replica and vLLM's engine through
    W3C `traceparent` headers; a client's own `traceparent` continues into the platform."""

    otlp_endpoint: str | None = Field(
        None,
        description="OTLP collector the spans are exported to: for http/protobuf the traces URL "
        "(e.g. http://127.0.0.1:6006/v1/traces, Phoenix; http://jaeger:4318/v1/traces), for "
        "grpc host:port as a URL (http://tempo:4317). Unset: tracing is off and costs nothing.",
    )
    protocol: OtlpProtocol = Field(
        "http/protobuf", description="OTLP transport of the exporter (vLLM's engine span too)."
    )
    sample_ratio: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Share of requests traced when the request carries no sampled parent; a "
        "client's `traceparent` decides for its own requests (parent-based sampling).",
    )
    service_name: str = Field(
        "llm-serving", min_length=1, description="OpenTelemetry `service.name` of every span."
    )
    project: str = Field(
        "llm-serving",
        min_length=1,
        description="Phoenix project the spans land in (resource `openinference.project.name`).",
    )
    query_url: str | None = Field(
        None,
        description="Base URL of a Phoenix server's REST API (e.g. http://127.0.0.1:6006), where "
        "the console's requests view and `llm-serving trace` read the spans back. `llm-serving "
        "up --tracing` sets both URLs to the Phoenix it starts.",
    )

    @field_validator("otlp_endpoint")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        return _http_url(value, "otlp_endpoint")

    @field_validator("query_url")
    @classmethod
    def _check_query_url(cls, value: str | None) -> str | None:
        return _http_url(value, "query_url")

    @property
    def enabled(self) -> bool:
        return self.otlp_endpoint is not None and self.sample_ratio > 0
