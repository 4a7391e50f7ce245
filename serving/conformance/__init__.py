"""Conformance matrix: one small case per OpenAI / vLLM API feature, run against several servers
(the platform, plain `vllm serve`, ...), reported as a feature x target table of
`ok` / `fails: <reason>` / `not offered`.

Layout: `outcome` classifies what a case ended with, `context` is what a case gets, the `*_cases`
modules hold the cases, `runner` runs them, `report` builds the table (pure), `cli` is the command.
"""
