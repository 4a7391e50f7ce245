"""`bench vllm-client` without a server: its cells' ratios, and bad input as one `error:` line
(exit 2) before any config, tokenizer or peer is loaded."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from serving.cli import main
from serving.loadgen.scenarios.vllm_client import ratios, table


def test_ratios_are_medians_over_rounds_against_the_baseline() -> None:
    def run(tok_s: float, failed: int = 0) -> dict[str, float]:
        return {
            "output_throughput": tok_s,
            "median_ttft_ms": 10.0,
            "median_itl_ms": 2.0,
            "median_tpot_ms": 2.0,
            "failed": failed,
        }

    cells = ratios({"a": [run(90), run(110), run(100)], "base": [run(50), run(50, 1)]}, "base")
    assert cells["a"]["output_throughput"] == 100 and cells["a"]["throughput_ratio"] == 2.0
    assert cells["base"]["failed"] == 1
    assert "| 16x8 | 4 | a | 100.0 | 2.000 |" in table({"16x8@4": cells}, "base")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shape", "16by8"], "--shape '16by8'"),
        (["--baseline", "nope"], "--baseline nope: not a target (a)"),
        (["--concurrency", "0"], "--concurrency '0'"),
        (["--target", "b=127.0.0.1:1"], "--target: expected distinct NAME=http://HOST:PORT"),
    ],
)
def test_bad_input_is_one_error_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(
        main,
        ["bench", "vllm-client", "--target", "a=http://127.0.0.1:1", "--model", "m", *args],
    )
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], result.output
