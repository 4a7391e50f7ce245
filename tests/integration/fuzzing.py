"""Stateless fuzzing of one app's OpenAPI document with schemathesis: every operation gets
schema-valid (positive) and schema-breaking (negative) cases; each answer is checked against the
platform's promise (no 5xx; every 4xx an OpenAI error body). Failures are collected, not raised
inside Hypothesis, so one run reports every distinct problem without shrinking against a server."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, GenerationMode

ERROR_KEYS = {"message", "type", "param", "code"}
# Generation costs CPU on a 2-core machine: fuzz the input checks, not the model's speed.
MAX_GENERATED_TOKENS = 4
MAX_CHOICES = 2
SEED = int(os.environ.get("LLM_SERVING_FUZZ_SEED", "0"))


@dataclass
class FuzzReport:
    cases: Counter = field(default_factory=Counter)  # operation -> cases sent
    statuses: Counter = field(default_factory=Counter)  # status -> count
    problems: dict[str, str] = field(default_factory=dict)  # distinct problem -> a reproducer

    @property
    def total(self) -> int:
        return sum(self.cases.values())


def problem_of(status: int, body: Any) -> str | None:
    """What is wrong with an answer, or None when it keeps the promise."""
    if status >= 500:
        return f"{status}"
    if status < 400:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or set(error) != ERROR_KEYS or not error.get("message"):
        return f"{status} not in the OpenAI error shape"
    return None


def bound_case(case: Case, served_model: str | None) -> Case:
    """Keep generated work small: few tokens per choice, and mostly the served model (a random
    model name is a cheap 404 that would hide the generation path)."""
    body = case.body
    if isinstance(body, dict):
        for key in ("max_tokens", "max_completion_tokens", "max_new_tokens"):
            value = body.get(key)  # JSON numbers: 1000.0 is a valid integer too
            if (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and value > MAX_GENERATED_TOKENS
            ):
                body[key] = MAX_GENERATED_TOKENS
        if "model" in body and body.get("max_tokens") is None:  # chat's default: the whole context
            body["max_tokens"] = MAX_GENERATED_TOKENS
        if isinstance(body.get("n"), int | float) and body["n"] > MAX_CHOICES:
            body["n"] = MAX_CHOICES  # the baseline generates choices one after another
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            body["prompt"] = prompt[:MAX_CHOICES]
        if served_model is not None and isinstance(body.get("model"), str):
            body["model"] = served_model
    return case


def reproducer(case: Case, base_url: str) -> str:
    """The request, unredacted (schemathesis' curl hides fields named like tokens)."""
    return (
        f"{case.method} {base_url}{case.formatted_path} query={case.query} "
        f"body={json.dumps(case.body, default=str)[:2000]}"
    )


def json_or_none(response: Any) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def fuzz_operation(
    operation: Any,
    mode: GenerationMode,
    examples: int,
    base_url: str,
    headers: dict[str, str],
    served_model: str | None,
    report: FuzzReport,
) -> None:
    @seed(SEED)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        derandomize=False,
    )
    @given(operation.as_strategy(generation_mode=mode))
    def run(case: Case) -> None:
        bound_case(case, served_model)
        started = time.monotonic()
        response = case.call(base_url=base_url, headers=headers, timeout=120)
        if os.environ.get("LLM_SERVING_FUZZ_TRACE"):
            print(
                f"{time.monotonic() - started:6.2f}s {response.status_code} {reproducer(case, base_url)[:400]}",
                flush=True,
            )
        report.cases[operation.label] += 1
        report.statuses[response.status_code] += 1
        problem = problem_of(response.status_code, json_or_none(response))
        if problem is not None:
            key = f"{operation.label}: {problem}: {response.text[:300]}"
            report.problems.setdefault(key, reproducer(case, base_url))

    with contextlib.suppress(Unsatisfiable):  # e.g. no negative case for a route without parameters
        run()


def fuzz_app(
    base_url: str,
    examples: int,
    headers: dict[str, str] | None = None,
    served_model: str | None = None,
    schema_headers: dict[str, str] | None = None,
    paths: frozenset[str] | None = None,
) -> FuzzReport:
    """Fuzz every operation of the app at `base_url` (its OpenAPI document at /openapi.json,
    fetched with `schema_headers`, default `headers`), or those under `paths`; every case is sent
    with `headers`."""
    headers = headers or {}
    schema = schemathesis.openapi.from_url(
        f"{base_url}/openapi.json", headers=schema_headers or headers, timeout=60
    )
    report = FuzzReport()
    for result in schema.get_all_operations():
        operation = result.ok()
        if paths is not None and operation.path not in paths:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz_operation(operation, mode, examples, base_url, headers, served_model, report)
    return report
