"""The scenarios of `llm-serving bench`, one module each: every one turns its options into a plan,
runs it and returns a Report for the one writer (serving/loadgen/report.py)."""
