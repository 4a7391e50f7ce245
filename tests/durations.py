"""Where the suite's time goes. As a pytest plugin (tests/conftest.py loads it) every run writes
each test's setup, call and teardown seconds to build/test-durations.json; as a command
(`python -m tests.durations`, `make durations`) it groups them by kind, module and fixture start,
and writes the slowest ten tests into docs/guide/development.md."""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import defaultdict
from datetime import date
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "build" / "test-durations.json"
DOCS = ROOT / "docs" / "guide" / "development.md"
BLOCK = re.compile(r"(<!-- slowest-tests:start -->\n).*?(<!-- slowest-tests:end -->)", re.S)
# What an integration module's tests exercise, for the by-kind table.
KINDS = {
    "test_fuzz": "fuzz",
    "test_auth": "fuzz",
    "test_faults": "fault",
    "test_soak": "fault",
    "test_exposure": "fault",
    "test_autoscaling": "autoscale",
    "test_config_apply": "autoscale",
    "test_bench": "bench",
    "test_seed_suite": "bench",
    "test_lm_eval": "bench",
    "test_analysis_console": "console",
}
# A setup or teardown this long starts or stops something (a platform, an app).
FIXTURE_START_S = 5.0


class Recorder:
    def __init__(self) -> None:
        self.phases: dict[str, dict[str, float]] = defaultdict(dict)
        self.started = time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.phases[report.nodeid][report.when] = round(report.duration, 2)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput") or not self.phases:  # xdist: the controller
            return
        RECORD.parent.mkdir(exist_ok=True)
        wall_s = round(time.monotonic() - self.started, 1)
        document = {"date": date.today().isoformat(), "wall_s": wall_s, "tests": self.phases}
        RECORD.write_text(json.dumps(document, indent=1))


def kind(nodeid: str) -> str:
    """unit, k8s, or what an integration test exercises (`integration` for the rest)."""
    path = Path(nodeid.split("::")[0])
    folder = path.parts[1] if len(path.parts) > 2 else "other"
    return KINDS.get(path.stem, folder) if folder == "integration" else folder


def table(header: tuple[str, ...], rows: list[tuple]) -> str:
    lines = [f"| {' | '.join(header)} |", f"|{'---|' * len(header)}"]
    return "\n".join(lines + [f"| {' | '.join(map(str, row))} |" for row in rows])


def grouped(tests: dict[str, dict[str, float]], key) -> list[tuple[str, int, float]]:
    sums: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for nodeid, phases in tests.items():
        entry = sums[key(nodeid)]
        entry[0] += 1
        entry[1] += sum(phases.values())
    rows = sorted(sums.items(), key=lambda item: -item[1][1])
    return [(name, int(n), round(s, 1)) for name, (n, s) in rows]


def fixture_starts(tests: dict[str, dict[str, float]]) -> list[tuple[str, str, float]]:
    """Setups and teardowns long enough to start or stop a platform or an app."""
    rows = [
        (nodeid, when, s)
        for nodeid, phases in tests.items()
        for when, s in phases.items()
        if when != "call" and s >= FIXTURE_START_S
    ]
    return sorted(rows, key=lambda row: -row[2])


def slowest(tests: dict[str, dict[str, float]], count: int = 10) -> list[tuple[str, float]]:
    totals = ((nodeid, round(sum(phases.values()), 1)) for nodeid, phases in tests.items())
    return sorted(totals, key=lambda row: -row[1])[:count]


def report(document: dict) -> str:
    tests = document["tests"]
    total = round(sum(sum(p.values()) for p in tests.values()), 1)
    return "\n\n".join(
        [
            f"{len(tests)} tests, {total} s of test time, {document['wall_s']} s wall "
            f"({document['date']})",
            table(("kind", "tests", "s"), grouped(tests, kind)),
            table(("module", "tests", "s"), grouped(tests, lambda n: n.split("::")[0])),
            table(("fixture start or stop (setup/teardown)", "phase", "s"), fixture_starts(tests)),
        ]
    )


def comparison(before: dict, after: dict) -> str:
    """Seconds per kind and per module, before and after a change (both records)."""
    sections = []
    for title, key in (("kind", kind), ("module", lambda n: n.split("::")[0])):
        old = {name: s for name, _, s in grouped(before["tests"], key)}
        new = {name: s for name, _, s in grouped(after["tests"], key)}
        rows = [(name, old.get(name, 0.0), new.get(name, 0.0)) for name in {*old, *new}]
        rows.sort(key=lambda row: -max(row[1], row[2]))
        sections.append(table((title, f"{before['date']} s", f"{after['date']} s"), rows))
    walls = ("pytest wall", before["wall_s"], after["wall_s"])
    return "\n\n".join([table(("", "before s", "after s"), [walls]), *sections])


def slowest_block(document: dict) -> str:
    rows = [(f"`{nodeid}`", s) for nodeid, s in slowest(document["tests"])]
    return (
        f"Measured {document['date']} by `make durations` after `make test` "
        f"({len(document['tests'])} tests, {document['wall_s']:.0f} s of pytest wall time); "
        "a test's time includes the fixtures it started first.\n\n"
        f"{table(('test', 's'), rows)}\n"
    )


def write_docs(document: dict, path: Path = DOCS) -> None:
    text = path.read_text()
    if not BLOCK.search(text):
        raise SystemExit(f"error: no slowest-tests block in {path}")
    path.write_text(BLOCK.sub(lambda m: m[1] + slowest_block(document) + m[2], text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("record", nargs="?", type=Path, default=RECORD)
    parser.add_argument("--docs", action="store_true", help=f"write the slowest ten into {DOCS}")
    parser.add_argument("--before", type=Path, help="an earlier record: print both side by side")
    args = parser.parse_args()
    for path in (args.record, args.before):
        if path is not None and not path.exists():
            raise SystemExit(f"error: no {path}: run `make test` (or pytest) first")
    document = json.loads(args.record.read_text())
    print(report(document))
    if args.before:
        print("\n" + comparison(json.loads(args.before.read_text()), document))
    if args.docs:
        write_docs(document)


if __name__ == "__main__":
    main()
