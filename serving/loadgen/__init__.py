"""Load generator: streaming OpenAI client, workloads, vLLM-`bench serve`-compatible metrics,
interleaved comparison of several targets, server-side evidence of batching, reports."""
