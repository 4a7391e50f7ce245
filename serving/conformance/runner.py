"""Run every case against each target, one request at a time (a bounded load: each case makes at
most three small requests, each with a timeout)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import openai

from serving.conformance.context import CaseContext, Target, case_context
from serving.conformance.feature_cases import FEATURE_CASES
from serving.conformance.outcome import OK, Outcome, classify_exception
from serving.conformance.route_cases import ROUTE_CASES
from serving.conformance.sampling_cases import SAMPLING_CASES

Case = Callable[[CaseContext], None]
CASES: dict[str, Case] = {**SAMPLING_CASES, **FEATURE_CASES, **ROUTE_CASES}


class ConformanceError(RuntimeError):
    """A run that cannot start (bad target, unreachable server); one `error:` line."""


@dataclass(frozen=True)
class CaseResult:
    case: str
    target: str
    outcome: Outcome
    seconds: float


def parse_target(spec: str) -> Target:
    """NAME=URL, URL an OpenAI base URL ending in /v1."""
    name, sep, url = spec.partition("=")
    if not sep or not name or not url:
        raise ConformanceError(f"--target {spec!r}: expected NAME=URL")
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")) or not url.endswith("/v1"):
        raise ConformanceError(f"--target {spec!r}: URL must be an http(s) base URL ending in /v1")
    return Target(name, url)


def parse_targets(specs: Iterable[str]) -> list[Target]:
    targets = [parse_target(spec) for spec in specs]
    names = [target.name for target in targets]
    if not targets or len(set(names)) != len(names):
        raise ConformanceError(f"--target: give each target once, with its own name (got {names})")
    return targets


def served_model(target: Target, api_key: str, timeout_s: float) -> str:
    """The first model id of the target's /v1/models."""
    client = openai.OpenAI(base_url=target.url, api_key=api_key, max_retries=0, timeout=timeout_s)
    try:
        with client:
            models = [model.id for model in client.models.list()]
    except openai.APIError as err:
        raise ConformanceError(
            f"target {target.name} at {target.url}: cannot list models: {err}"
        ) from None
    if not models:
        raise ConformanceError(f"target {target.name} at {target.url}: /v1/models lists no model")
    return models[0]


def run_case(name: str, case: Case, ctx: CaseContext, target: Target) -> CaseResult:
    started = time.monotonic()
    try:
        case(ctx)
        outcome = Outcome(OK)
    except Exception as err:  # noqa: BLE001 - every failure of a case is a cell of the table
        outcome = classify_exception(err)
    return CaseResult(name, target.name, outcome, time.monotonic() - started)


def run_target(
    target: Target, model: str, api_key: str, timeout_s: float, cases: dict[str, Case] = CASES
) -> list[CaseResult]:
    with case_context(target, model, api_key, timeout_s) as ctx:
        return [run_case(name, case, ctx, target) for name, case in cases.items()]
