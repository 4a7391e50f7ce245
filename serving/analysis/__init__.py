"""Pure functions that open a transformers model up: architecture, KV-cache math, attention weights,
per-token latency. No Ray, no HTTP: the analysis deployment and `llm-serving analyze` both call them."""

from __future__ import annotations


class AnalysisInputError(ValueError):
    """Input the analysis cannot use (unknown layer, bad dtype, prompt over a limit); the message
    names the allowed values or the limit, `param` the offending input."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
