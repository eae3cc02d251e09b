"""``falcon-es bench cli``: how fast the command line answers, against Python itself.

Each round starts, in fresh interpreters and in turn: ``python -c pass`` (the floor:
the interpreter and its site packages), ``python -c "import sqlalchemy"`` (the floor of
every command that reads the database), ``python -c "import falcon_es.cli"`` (the
program before any command), ``falcon-es task list`` on a job table of ``tasks`` rows
and ``falcon-es task submit`` of one task. Taking them in turn, round after round,
slows every figure alike on a busy machine; the report gives medians, and each
command's ratio to the floor (the single submits add a row a round). Then ``task submit --spec-file`` of a ``sweep`` of tasks
(JSON lines, one transaction) runs a few times, against the same sweep submitted one
command per task (estimated from the single submit's median).

Everything runs on a scratch database: a temporary SQLite file, or a scratch database
on the MySQL/MariaDB server of ``server``, with the schema and the rows made here.
Target: ``task list`` within 0.25 s.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from falcon_es.storage import db
from falcon_es.jobtable import job_rows
from falcon_es.domain.clock import utcnow
from falcon_es.bench.scratch import scratch_mysql_database
from falcon_es.storage.tables import JobTable

TARGET_SECONDS = 0.25
SPEC = MappingProxyType({"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e",
                         "topology": "2x2"})
#: Sweep submits timed (each inserts ``sweep`` rows).
SWEEP_ROUNDS = 3


class BenchCommandError(RuntimeError):
    """A command under measurement failed (its own words)."""


def cli_benchmark(*, runs: int = 9, tasks: int = 100, sweep: int = 1000,
                  server: str | None = None) -> dict[str, Any]:
    """The figures of one run (see the module's docstring)."""
    with _scratch_url(server) as (url, folder):
        engine = db.make_engine(url)
        try:
            db.upgrade(engine)
            db.create_job_table(engine, JobTable())  # the scratch database's own
            job_rows.submit_many(engine, [job_rows.NewTask(f"task-{i}", f"user-{i % 5}", SPEC)
                                          for i in range(tasks)], utcnow())
        finally:
            engine.dispose()
        falcon = [sys.executable, "-m", "falcon_es", "--db", url]
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "import sqlalchemy": [sys.executable, "-c", "import sqlalchemy"],
            "import falcon_es.cli": [sys.executable, "-c", "import falcon_es.cli"],
            "task list": [*falcon, "task", "list"],
            "task submit": [*falcon, "task", "submit", "--actor", "bench", "--name", "one",
                            "--tpu-type", "v6e", "--topology", "2x2", "--image", SPEC["image"]],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(runs):
            for name, argv in commands.items():
                times[name].append(_timed(argv))
        sweep_file = folder / "sweep.jsonl"
        sweep_file.write_text("".join(
            json.dumps({"name": f"sweep-{i}", "actor": "bench", **SPEC, "env": {"I": str(i)}})
            + "\n" for i in range(sweep)), encoding="utf-8")
        sweeps = [_timed([*falcon, "task", "submit", "--spec-file", str(sweep_file)])
                  for _ in range(SWEEP_ROUNDS)]
    medians = {name: statistics.median(values) for name, values in times.items()}
    floor = medians["python -c pass"]
    list_seconds = medians["task list"]
    return {
        "backend": "sqlite" if server is None else "mysql",
        "runs": runs, "tasks": tasks, "sweep": sweep,
        "bytecode_cached": _bytecode_cached(),
        "median_seconds": medians,
        "min_seconds": {name: min(values) for name, values in times.items()},
        "ratio_to_python": {name: m / floor for name, m in medians.items()},
        "sweep_submit_seconds": statistics.median(sweeps),
        "sweep_as_single_submits_seconds": medians["task submit"] * sweep,
        "targets": {f"task list <= {TARGET_SECONDS} s": list_seconds <= TARGET_SECONDS},
    }


def format_report(report: dict[str, Any]) -> str:
    medians, ratios = report["median_seconds"], report["ratio_to_python"]
    lines = [
        (f"cli benchmark on {report['backend']}: medians of {report['runs']} runs, each "
         f"command in a fresh interpreter, job table of {report['tasks']:,} rows"
         + ("" if report["bytecode_cached"] else
            " (falcon_es compiled on every start: no bytecode cache)")),
        "",
        *(f"{name:<22} {medians[name] * 1000:>8.0f} ms  x{ratios[name]:.1f} python -c pass"
          for name in medians),
        "",
        (f"task submit --spec-file of {report['sweep']:,} tasks (one transaction): "
         f"{report['sweep_submit_seconds']:.2f} s; as {report['sweep']:,} single submits: "
         f"~{report['sweep_as_single_submits_seconds']:.0f} s"),
        "targets: " + ", ".join(f"{k}: {'met' if v else 'MISSED'}"
                                for k, v in report["targets"].items()),
    ]
    return "\n".join(lines)


@contextlib.contextmanager
def _scratch_url(server: str | None) -> Iterator[tuple[str, Path]]:
    with tempfile.TemporaryDirectory(prefix="falcon-bench-cli-") as tmp:
        folder = Path(tmp)
        if server is None:
            yield f"sqlite:///{folder / 'falcon.db'}", folder
            return
        with scratch_mysql_database(server, "falcon_bench_cli") as url:
            yield url, folder


def _timed(argv: Sequence[str]) -> float:
    """Wall time of one command, from start to exit (its output discarded)."""
    start = time.perf_counter()
    result = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, check=False)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise BenchCommandError(f"{' '.join(argv[1:])} failed: {result.stderr.strip()}")
    return elapsed


def _bytecode_cached() -> bool:
    """Whether the interpreters started here find falcon_es compiled (an installed wheel
    is; a source checkout under PYTHONDONTWRITEBYTECODE compiles every module each time)."""
    spec = importlib.util.find_spec("falcon_es.cli.tasks")
    if spec is None or spec.origin is None:
        return False
    source, cached = Path(spec.origin), Path(importlib.util.cache_from_source(spec.origin))
    return cached.exists() and cached.stat().st_mtime >= source.stat().st_mtime
