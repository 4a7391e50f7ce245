"""OpenAI-compatible protocol shared by every engine: request models, errors, routes, SSE."""
