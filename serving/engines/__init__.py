"""Engines behind the OpenAI routes: each streams text deltas for token-id prompts."""
