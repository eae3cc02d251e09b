"""The ``falcon-es`` CLI of the event-sourced core on both dialects: db, cluster, task,
history, events, chart; ``--json`` outputs; bad input as one ``falcon-es:`` line with a
meaningful exit code, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

from falcon_es.storage import db
from falcon_es.app.application import open_app
from falcon_es.app.bootstrap import RunOptions, build_service
from falcon_es.cli import EXIT_BAD_INPUT, EXIT_DATABASE, EXIT_PROBLEM, main
from falcon_es.domain.clock import VirtualClock
from falcon_es.config.settings import Settings
from falcon_es.storage.tables import JobTable, clusters
from falcon_es.handlers import intake

from tests.conftest import MYSQL_SERVER, scratch_mysql

#: The job table under Falcon-ES's own names, as the fixtures create it.
job = JobTable().table

JOB_COLUMNS = set(job.c.keys())
CLUSTER_COLUMNS = set(clusters.c.keys())
SPEC = {"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e", "topology": "2x2"}


def cli(db_url: str | None, *args: str, env: dict[str, str] | None = None) -> Result:
    prefix = ["--db", db_url] if db_url else []
    return CliRunner(env=env).invoke(main, [*prefix, *args])


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


def one_line_failure(result: Result, code: int, starts: str) -> str:
    """A failure is exactly one stderr line ``falcon-es: ...``, and no traceback."""
    assert result.exit_code == code, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"falcon-es: {starts}"), lines[0]
    assert "Traceback" not in result.output
    return lines[0]


def add_cluster(db_url: str, name: str = "gke-a", *extra: str) -> Result:
    return cli(db_url, "cluster", "add", name, "--project", "proj-1", "--location", "us-east5-b",
               "--tpu-type", "v6e", "--gcs-bucket", "logs-bucket", *extra)


def submit(db_url: str, *extra: str) -> str:
    return ok(cli(db_url, "task", "submit", "--actor", "user-a", "--name", "train",
                  "--tpu-type", "v6e", "--topology", "2x2",
                  "--image", "us-docker.pkg.dev/p/r/train:1", *extra)).strip()


def take_in(db_url: str) -> None:
    """One controller tick of intake, so the log knows the submitted rows."""
    app = open_app(Settings(db_url=db_url), VirtualClock())
    try:
        build_service(app, None, RunOptions(handlers=(
            intake.accept_new_rows, intake.notice_abort_requests))).controller.tick()
    finally:
        app.close()


# ------------------------------------------------------------------ db


def test_db_upgrade_creates_the_schema_and_is_idempotent(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    out = ok(cli(url, "db", "upgrade", "--create-job-table"))
    assert out.startswith("database at revision ")
    assert out.splitlines()[-1] == "job table job: created"
    tables = set(sa.inspect(sa.create_engine(url)).get_table_names())
    assert {"task_events", "log_head", "checkpoints", "clusters", "job"} <= tables
    again = ok(cli(url, "db", "upgrade", "--create-job-table"))
    assert again.splitlines()[0] == out.splitlines()[0]
    assert again.splitlines()[-1].startswith("job table job: present, left as it is")


def test_db_upgrade_on_mysql(db_url: str) -> None:
    out = ok(cli(db_url, "db", "upgrade"))
    assert out.startswith("database at revision ")


def test_db_check_passes_on_the_migrated_table(db_url: str) -> None:
    out = ok(cli(db_url, "db", "check"))
    assert out.splitlines()[0] == "job: all 16 columns present with usable types"
    assert "(all present; " in out.splitlines()[1]


# ------------------------------------------------------------------ clusters


def test_cluster_add_list_and_set_status(db_url: str) -> None:
    assert ok(add_cluster(db_url)).startswith("registered gke-a (v6e, active) id ")
    added = json.loads(ok(add_cluster(db_url, "gke-b", "--reservation", "res-1", "--status",
                                      "maintenance", "--json")))
    assert set(added) == CLUSTER_COLUMNS
    assert (added["default_reservation"], added["status"]) == ("res-1", "maintenance")

    listed = json.loads(ok(cli(db_url, "cluster", "list", "--json")))
    assert [c["name"] for c in listed] == ["gke-a", "gke-b"]
    assert all(set(c) == CLUSTER_COLUMNS for c in listed)
    table = ok(cli(db_url, "cluster", "list"))
    assert table.splitlines()[0].split()[:3] == ["name", "tpu_type", "status"]
    assert "gke-b" in table and "maintenance" in table

    assert ok(cli(db_url, "cluster", "set-status", "gke-b", "active")).strip() == "gke-b is active"
    assert ok(cli(db_url, "cluster", "set-status", "gke-a", "offline")).strip() == "gke-a is offline"
    listed = {c["name"]: c["status"] for c in json.loads(ok(cli(db_url, "cluster", "list", "--json")))}
    assert listed == {"gke-a": "offline", "gke-b": "active"}

    events = [json.loads(line) for line in ok(cli(db_url, "events", "--json")).splitlines()]
    assert [e["type"] for e in events] == [
        "ClusterRegistered", "ClusterRegistered", "ClusterStatusChanged", "ClusterStatusChanged"]
    assert events[2]["data"]["new_status"] == "active" and events[2]["actor"] == "operator"


def test_cluster_bad_input(db_url: str) -> None:
    one_line_failure(cli(db_url, "cluster", "set-status", "nope", "active"), EXIT_BAD_INPUT,
                     "cluster 'nope' is not registered")
    ok(add_cluster(db_url))
    one_line_failure(add_cluster(db_url), EXIT_BAD_INPUT, "cluster 'gke-a' is already registered")
    one_line_failure(add_cluster(db_url, "Bad_Name"), EXIT_BAD_INPUT, "cluster name 'Bad_Name'")
    result = cli(db_url, "cluster", "add", "gke-c", "--project", "p", "--location", "l",
                 "--tpu-type", "v99", "--gcs-bucket", "b")
    one_line_failure(result, EXIT_BAD_INPUT, "TPU type 'v99' is unknown; known: ")
    result = cli(db_url, "cluster", "set-status", "gke-a", "broken")
    assert result.exit_code == EXIT_BAD_INPUT and "Traceback" not in result.output
    assert "'broken' is not one of 'active', 'maintenance', 'offline'" in result.stderr


# ------------------------------------------------------------------ tasks


def test_task_submit_list_show_abort(db_url: str) -> None:
    first = submit(db_url, "--command", "python", "--command", "train.py", "--supply-mode",
                   "flex-start", "--timeout", "3600")
    assert len(first) == 32
    second = json.loads(ok(cli(db_url, "task", "submit", "--actor", "user-b", "--name", "eval",
                               "--tpu-type", "v6e", "--topology", "2x4", "--image", "img:1",
                               "--json")))["id"]

    tasks = json.loads(ok(cli(db_url, "task", "list", "--json")))
    assert [t["id"] for t in tasks] == [first, second]
    assert all(set(t) == JOB_COLUMNS for t in tasks)
    assert tasks[0]["spec"] == {**SPEC, "command": ["python", "train.py"], "supply_mode": "flex-start",
                                "timeout_seconds": 3600}
    assert (tasks[0]["status"], tasks[0]["reason"], tasks[0]["message"]) == ("Pending", None, None)
    table = ok(cli(db_url, "task", "list"))
    assert table.splitlines()[0].split() == ["id", "name", "actor", "status", "reason", "message",
                                             "created_at"]
    assert ok(cli(db_url, "task", "list", "--limit", "1", "--json")).count('"id"') == 1

    shown = json.loads(ok(cli(db_url, "task", "show", second, "--json")))
    assert set(shown) == JOB_COLUMNS and shown["name"] == "eval"
    assert f"id              {second}" in ok(cli(db_url, "task", "show", second))

    assert ok(cli(db_url, "task", "abort", second)).strip() == f"{second}: Aborting (was Pending)"
    assert ok(cli(db_url, "task", "abort", second)).strip() == f"{second}: Aborting (was Aborting)"
    aborting = json.loads(ok(cli(db_url, "task", "list", "--status", "Aborting", "--json")))
    assert [t["id"] for t in aborting] == [second]
    assert aborting[0]["aborting_at"] is not None


def test_task_list_shows_text_as_written(db_url: str) -> None:
    for name in ("12e4", "0042"):
        ok(cli(db_url, "task", "submit", "--actor", "user-a", "--name", name, "--tpu-type", "v6e",
               "--topology", "2x2", "--image", "img:1"))
    names = [line.split()[1] for line in ok(cli(db_url, "task", "list")).splitlines()[2:]]
    assert names == ["12e4", "0042"]


def test_task_submit_from_a_spec_file_with_flags_overriding(db_url: str, tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({**SPEC, "env": {"STEPS": "10"}, "topology": "4x4"}))
    task_id = ok(cli(db_url, "task", "submit", "--actor", "user-a", "--name", "from-file",
                     "--spec-file", str(spec_file), "--topology", "2x2")).strip()
    shown = json.loads(ok(cli(db_url, "task", "show", task_id, "--json")))
    assert shown["spec"] == {**SPEC, "env": {"STEPS": "10"}}


def test_task_bad_input(db_url: str, tmp_path: Path) -> None:
    one_line_failure(cli(db_url, "task", "show", "nope"), EXIT_BAD_INPUT, "task 'nope' does not exist")
    one_line_failure(cli(db_url, "task", "abort", "nope"), EXIT_BAD_INPUT, "task 'nope' does not exist")
    result = cli(db_url, "task", "submit", "--actor", "a", "--name", "n", "--image", "i")
    one_line_failure(result, EXIT_BAD_INPUT, "task submit: missing --tpu-type, --topology")

    broken = tmp_path / "broken.json"
    broken.write_text('{"image": "i",\n "tpu_type": }')
    result = cli(db_url, "task", "submit", "--actor", "a", "--name", "n", "--spec-file", str(broken))
    one_line_failure(result, EXIT_BAD_INPUT, f"spec file {broken}: not valid JSON at line 2 column")
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    result = cli(db_url, "task", "submit", "--actor", "a", "--name", "n", "--spec-file", str(listed))
    one_line_failure(result, EXIT_BAD_INPUT,
                     f"spec file {listed}: index 0: expected a JSON object, found number")
    missing = tmp_path / "missing.json"
    result = cli(db_url, "task", "submit", "--actor", "a", "--name", "n", "--spec-file", str(missing))
    one_line_failure(result, EXIT_BAD_INPUT, f"spec file {missing}: No such file or directory")
    result = cli(db_url, "task", "submit", "--actor", "a" * 300, "--name", "n", "--tpu-type", "v6e",
                 "--topology", "2x2", "--image", "i")
    one_line_failure(result, EXIT_BAD_INPUT, "task submit: --actor is longer than 128 characters")
    result = cli(db_url, "task", "submit", "--actor", "a", "--name", "n", "--tpu-type", "v6e",
                 "--topology", "3x3", "--image", "i")
    line = one_line_failure(result, EXIT_BAD_INPUT, "task submit: topology: ")
    assert line.endswith("(InvalidTopology)")
    assert json.loads(ok(cli(db_url, "task", "list", "--json"))) == []


def rows(db_url: str) -> list[dict[str, object]]:
    return json.loads(ok(cli(db_url, "task", "list", "--json")))


def test_task_submit_many_from_json_lines(db_url: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.jsonl"
    sweep.write_text("\n".join(json.dumps(entry) for entry in [
        {"name": "lr-1", "actor": "user-a", **SPEC, "env": {"LR": "0.1"}},
        {"name": "lr-2", "actor": "user-b", **SPEC, "env": {"LR": "0.2"}, "topology": "2x4"},
        {"name": "lr-3", **SPEC, "tpu_type": "v5e"},
    ]) + "\n\n")
    out = ok(cli(db_url, "task", "submit", "--spec-file", str(sweep), "--actor", "sweeper",
                 "--tpu-type", "v6e", "--command", "train"))
    ids = out.split()
    tasks = rows(db_url)
    assert [t["id"] for t in tasks] == ids and len(set(ids)) == 3
    # The options apply to every task and win over the file.
    assert [(t["name"], t["actor"], t["status"]) for t in tasks] == [
        ("lr-1", "sweeper", "Pending"), ("lr-2", "sweeper", "Pending"), ("lr-3", "sweeper", "Pending")]
    assert tasks[1]["spec"] == {**SPEC, "env": {"LR": "0.2"}, "topology": "2x4", "command": ["train"]}
    assert tasks[2]["spec"] == {**SPEC, "command": ["train"]}
    assert len({t["created_at"] for t in tasks}) == 1  # one transaction, one moment


def test_task_submit_many_from_a_json_list_and_stdin_with_json_out(db_url: str,
                                                                  tmp_path: Path) -> None:
    listed = tmp_path / "sweep.json"
    listed.write_text(json.dumps([{"name": f"t{i}", "actor": "user-a", **SPEC}
                                  for i in range(3)], indent=2))
    out = ok(cli(db_url, "task", "submit", "--spec-file", str(listed), "--json"))
    printed = [json.loads(line) for line in out.splitlines()]
    assert [(p["name"], p["actor"]) for p in printed] == [("t0", "user-a"), ("t1", "user-a"),
                                                           ("t2", "user-a")]
    piped = CliRunner().invoke(main, ["--db", db_url, "task", "submit", "--spec-file", "-"],
                               input=json.dumps({"name": "t3", "actor": "user-b", **SPEC}))
    assert [t["id"] for t in rows(db_url)] == [p["id"] for p in printed] + [ok(piped).strip()]


def test_task_submit_of_a_thousand_tasks_is_one_command(db_url: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.jsonl"
    sweep.write_text("".join(json.dumps({"name": f"sweep-{i}", **SPEC, "env": {"I": str(i)}}) + "\n"
                             for i in range(1000)))
    ids = ok(cli(db_url, "task", "submit", "--actor", "user-a", "--spec-file", str(sweep))).split()
    assert len(set(ids)) == 1000
    tasks = {t["id"]: t for t in rows(db_url)}
    assert [tasks[i]["spec"]["env"]["I"] for i in ids] == [str(i) for i in range(1000)]


@pytest.mark.parametrize(("text", "says"), [
    ('{"name": "a", "actor": "u", "image": "i", "tpu_type": "v6e", "topology": "2x2"}\n'
     '{"name": "b", "actor": "u", "image": "i", "tpu_type": "v6e", "topology": "9x9"}\n',
     "line 2: topology: "),
    ('{"name": "a", "actor": "u", "image": "i", "tpu_type": "v6e", "topology": "2x2"}\n\n'
     '{"name": "b", "actor": "u", "image": "i", "tpu_type": "v6e", "topology": \n',
     "line 3: not valid JSON at column"),
    ('[{"name": "a", "actor": "u", "image": "i", "tpu_type": "v6e", "topology": "2x2"},\n'
     ' {"name": "b", "image": "i", "tpu_type": "v6e", "topology": "2x2"}]',
     "index 1: missing actor (fields of the entry, or the options --actor)"),
    ('[{"name": "a", "actor": "u", "image": "i", "tpu_type": "v6e", "topology": "2x2"}, "b"]',
     "index 1: expected a JSON object, found string"),
    ('{"name": "a", "actor": "u", "image": "i", "tpu_type": "v6e", "topology": "2x2"}\n'
     '{"name": "b", "actor": 7, "image": "i", "tpu_type": "v6e", "topology": "2x2"}\n',
     "line 2: actor must be a string, found number"),
    ('{"name": "a", "actor": "u", "image": "i", "tpu_type": "v6e", "topology": "2x2", '
     '"privileged": true}', "privileged: not allowed"),
    ('[{"name": "a", "actor": "u", "image": "i", "tpu_type": "v6e", "topology": "2x2", '
     '"timeout_seconds": 99999999}]', "index 0: timeout_seconds: 99999999 exceeds the ceiling"),
    ("", "not valid JSON at line 1 column 1"),
    ("[]", "no tasks in it; nothing submitted"),
    ('"a"', "expected a JSON object, a JSON list of objects or JSON lines, found string"),
], ids=["bad topology", "broken line", "no actor", "not an object", "actor a number",
        "forbidden field", "timeout over the ceiling", "empty", "empty list", "a string"])
def test_task_submit_many_refuses_a_bad_entry_and_submits_nothing(
        db_url: str, tmp_path: Path, text: str, says: str) -> None:
    sweep = tmp_path / "sweep.jsonl"
    sweep.write_text(text)
    line = one_line_failure(cli(db_url, "task", "submit", "--spec-file", str(sweep)),
                            EXIT_BAD_INPUT, f"spec file {sweep}")
    assert says in line, line
    assert rows(db_url) == []


def test_task_submit_many_is_one_transaction(db_url: str, tmp_path: Path) -> None:
    """The database refusing the last row leaves none of the others behind."""
    engine = db.make_engine(db_url)
    refuse = ("CREATE TRIGGER refuse_poison BEFORE INSERT ON job FOR EACH ROW "
              + ("WHEN NEW.name = 'poison' BEGIN SELECT RAISE(ABORT, 'poisoned'); END"
                 if engine.dialect.name == "sqlite" else
                 "BEGIN IF NEW.name = 'poison' THEN SIGNAL SQLSTATE '23000' "
                 "SET MESSAGE_TEXT = 'poisoned'; END IF; END"))
    with engine.begin() as conn:
        conn.exec_driver_sql(refuse)
    try:
        sweep = tmp_path / "sweep.jsonl"
        sweep.write_text("".join(json.dumps({"name": name, "actor": "u", **SPEC}) + "\n"
                                 for name in ("a", "b", "poison")))
        result = cli(db_url, "task", "submit", "--spec-file", str(sweep))
        assert result.exit_code != 0 and "Traceback" not in result.output
        assert len(result.stderr.strip().splitlines()) == 1 and "poisoned" in result.stderr
        assert rows(db_url) == []
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TRIGGER refuse_poison")
        engine.dispose()


def test_abort_of_a_finished_task_is_refused(db_url: str) -> None:
    engine = db.make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(job.insert().values(id="old", name="n", actor="a", status="Succeeded",
                                         created_at=VirtualClock().now()))
    engine.dispose()
    one_line_failure(cli(db_url, "task", "abort", "old"), EXIT_BAD_INPUT,
                     "task old has already ended (Succeeded); nothing to abort")


# ------------------------------------------------------------------ the log


def test_history_and_events(db_url: str) -> None:
    task_id = submit(db_url)
    take_in(db_url)
    ok(cli(db_url, "task", "abort", task_id))
    take_in(db_url)

    history = json.loads(ok(cli(db_url, "history", task_id, "--json")))
    assert [h["type"] for h in history] == ["TaskAccepted", "AbortRequested"]
    assert [h["version"] for h in history] == [1, 2]
    assert history[0]["actor"] == "upper-layer:user-a" and history[1]["actor"] == "upper-layer"
    assert history[0]["data"]["topology"] == "2x2"
    assert {"seq", "recorded_at", "causation_id", "correlation_id"} <= set(history[0])
    table = ok(cli(db_url, "history", task_id))
    assert table.splitlines()[0].split() == ["version", "recorded_at", "type", "actor",
                                             "causation_id", "data"]
    assert "AbortRequested" in table

    lines = ok(cli(db_url, "events", "--json")).splitlines()
    everything = [json.loads(line) for line in lines]
    assert [e["seq"] for e in everything] == [1, 2]
    after = [json.loads(line) for line in ok(cli(db_url, "events", "--after", "1", "--json")).splitlines()]
    assert after == everything[1:]
    assert ok(cli(db_url, "events", "--after", "2")) == ""
    text = ok(cli(db_url, "events"))
    assert f"{task_id}  v1  TaskAccepted" in text and f"{task_id}  v2  AbortRequested" in text


def test_history_of_unknown_and_not_yet_taken_in_tasks(db_url: str) -> None:
    one_line_failure(cli(db_url, "history", "nope"), EXIT_BAD_INPUT, "task 'nope' does not exist")
    task_id = submit(db_url)
    one_line_failure(cli(db_url, "history", task_id), EXIT_PROBLEM,
                     f"task {task_id} has no events in the log yet")


def test_chart_prints_mermaid_and_dot() -> None:
    mermaid = ok(cli(None, "chart"))
    assert mermaid.startswith("stateDiagram-v2")
    assert ok(cli(None, "chart", "--format", "mermaid")) == mermaid
    dot = ok(cli(None, "chart", "--format", "dot"))
    assert dot.startswith("digraph TaskChart {") and dot.rstrip().endswith("}")
    assert '"Pending.Dispatching" -> "Running" [label="PodsRunning"];' in dot


def test_python_dash_m_runs_the_same_cli() -> None:
    result = subprocess.run([sys.executable, "-m", "falcon_es", "--help"], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    for command in ("db", "cluster", "task", "history", "events", "replay", "chart", "bench"):
        assert f"  {command} " in result.stdout


# ------------------------------------------------------------------ unusable databases


@pytest.fixture(params=["sqlite", "mysql"])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database that exists but has no Falcon-ES schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    with scratch_mysql("falcon_empty") as url:
        yield url


@pytest.mark.parametrize("command", [
    ("task", "list"), ("task", "show", "x"), ("history", "x"), ("events",),
    ("cluster", "list"), ("replay", "--verify"),
])
def test_no_schema_yet_says_to_run_db_upgrade(empty_db_url: str, command: tuple[str, ...]) -> None:
    line = one_line_failure(cli(empty_db_url, *command), EXIT_DATABASE,
                            "the database has no Falcon-ES schema")
    assert line.endswith("run: falcon-es db upgrade")


@pytest.mark.parametrize(("url", "says"), [
    ("not a url", "database URL 'not a url' is not a valid URL"),
    ("postgresql://u@localhost/x", "database URL 'postgresql://u@localhost/x': unsupported dialect 'postgresql'"),
    ("mysql://root@127.0.0.1/x", "database URL 'mysql://root@127.0.0.1/x': use the PyMySQL driver"),
])
def test_bad_database_urls(url: str, says: str) -> None:
    one_line_failure(cli(url, "task", "list"), EXIT_BAD_INPUT, says)


def test_unreachable_databases(tmp_path: Path) -> None:
    one_line_failure(cli("mysql+pymysql://root@127.0.0.1:1/x", "task", "list"), EXIT_DATABASE,
                     "database error: (2003")
    unknown = f"{MYSQL_SERVER}/falcon_no_such_db_{uuid.uuid4().hex[:6]}"
    one_line_failure(cli(unknown, "task", "list"), EXIT_DATABASE, "database error: (1049")
    one_line_failure(cli(f"sqlite:///{tmp_path / 'no' / 'dir' / 'x.db'}", "db", "upgrade"),
                     EXIT_DATABASE, "database error: unable to open database file")


def test_bad_environment_is_one_line(db_url: str) -> None:
    result = cli(db_url, "task", "list", env={"FALCON_LANG": "klingon"})
    one_line_failure(result, EXIT_BAD_INPUT, "FALCON_LANG='klingon': expected one of en, zh")


def test_db_url_from_the_environment(db_url: str) -> None:
    ok(add_cluster(db_url))
    listed = json.loads(ok(cli(None, "cluster", "list", "--json", env={"FALCON_DB_URL": db_url})))
    assert [c["name"] for c in listed] == ["gke-a"]


# ------------------------------------------------------------------ bench store


def test_bench_store_runs_on_a_scratch_database_of_the_given_kind(db_url: str, tmp_path: Path) -> None:
    """A small run: every figure is there, the replay matched, and the database named by
    --db is left exactly as it was (the bench works in a scratch database beside it)."""
    ok(add_cluster(db_url))
    report = json.loads(ok(cli(None, "bench", "store", "--db", db_url, "--events", "400",
                               "--tick", "50", "--json")))
    assert report["backend"] == ("sqlite" if db_url.startswith("sqlite") else "mysql")
    assert (report["events"], report["tick"], report["ticks"]) == (400, 50, 8)
    for figure in ("append_events_per_s", "raw_insert_events_per_s", "replay_events_per_s",
                   "raw_scan_events_per_s", "append_ratio", "replay_ratio"):
        assert report[figure] > 0, figure
    assert report["replay_matches_live"] is True
    assert set(report["targets"]) == {"append_ratio >= 0.7", "replay_ratio >= 0.85"}
    assert [c["name"] for c in json.loads(ok(cli(db_url, "cluster", "list", "--json")))] == ["gke-a"]
    assert [json.loads(line)["type"] for line in ok(cli(db_url, "events", "--json")).splitlines()] == [
        "ClusterRegistered"]
    if db_url.startswith("sqlite"):
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".falcon-bench")) == []


def test_bench_store_prints_a_readable_report(tmp_path: Path) -> None:
    text = ok(cli(f"sqlite:///{tmp_path / 'x.db'}", "bench", "store", "--events", "200", "--tick", "20"))
    assert text.startswith("store benchmark on sqlite")
    assert "(a) append, tick transactions, inline projection" in text
    assert "a/b = " in text and "c/d = " in text
    assert "matches the live job table" in text
    assert list(tmp_path.iterdir()) == [], "the scratch file beside x.db is removed, x.db never made"


def test_bench_store_takes_sqlite_for_a_temporary_file_as_bench_e2e_does(
        mysql_url: str) -> None:
    """``--db sqlite`` measures SQLite whatever database the settings name."""
    report = json.loads(ok(cli(mysql_url, "bench", "store", "--db", "sqlite", "--events", "100",
                               "--tick", "50", "--json")))
    assert report["backend"] == "sqlite" and report["events"] == 100


def test_bench_store_bad_input() -> None:
    result = cli(None, "bench", "store", "--events", "0")
    assert result.exit_code == EXIT_BAD_INPUT and "Traceback" not in result.output
    one_line_failure(cli(None, "bench", "store", "--db", "postgresql://x/y"), EXIT_BAD_INPUT,
                     "database URL 'postgresql://x/y': unsupported dialect")


# ------------------------------------------------------------------ bench cli


@pytest.mark.parametrize("backend", ["sqlite", "mysql"])
def test_bench_cli_times_the_commands_against_python_itself(backend: str) -> None:
    server = ["--server", MYSQL_SERVER] if backend == "mysql" else []
    report = json.loads(ok(cli(None, "bench", "cli", "--runs", "1", "--tasks", "3",
                               "--sweep", "5", *server, "--json")))
    assert report["backend"] == backend
    commands = ["python -c pass", "import sqlalchemy", "import falcon_es.cli", "task list",
                "task submit"]
    assert list(report["median_seconds"]) == commands
    assert all(report["median_seconds"][c] > 0 for c in commands)
    assert report["ratio_to_python"]["python -c pass"] == 1.0
    assert report["sweep_submit_seconds"] > 0
    assert report["sweep_as_single_submits_seconds"] == pytest.approx(
        5 * report["median_seconds"]["task submit"])
    assert list(report["targets"]) == ["task list <= 0.25 s"]
    text = ok(cli(None, "bench", "cli", "--runs", "1", "--tasks", "0", "--sweep", "2"))
    assert text.startswith("cli benchmark on sqlite: medians of 1 runs")
    assert "task submit --spec-file of 2 tasks (one transaction)" in text


def test_bench_cli_bad_input() -> None:
    one_line_failure(cli(None, "bench", "cli", "--server", "postgresql://x/y"), EXIT_BAD_INPUT,
                     "database URL 'postgresql://x/y': unsupported dialect")
    one_line_failure(cli(None, "bench", "cli", "--server", "mysql+pymysql://root@127.0.0.1:1"),
                     EXIT_DATABASE, "mysql+pymysql://root@127.0.0.1:1: cannot create a scratch")



# ------------------------------------------------------------------ priority requests

PRIORITY_ENV = {"FALCON_JOB_TABLE": "job_prio", "FALCON_JOB_PRIORITY_REQUESTS": "true"}


def test_task_set_priority_writes_the_request_and_refuses_what_cannot_apply(db_url: str) -> None:
    """The CLI asks as the upper layer does (the row's priority columns, read by the
    controller's inbox), never appending to the log itself."""
    assert ok(cli(db_url, "db", "upgrade", "--create-job-table", env=PRIORITY_ENV))
    prio = JobTable(Settings.from_env(PRIORITY_ENV).job_mapping)
    engine = db.make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(prio.table.delete())
    checked = ok(cli(db_url, "db", "check", env=PRIORITY_ENV))
    assert checked.splitlines()[0] == "job_prio: all 19 columns present with usable types"
    assert "present  (priority_requested_at) as ix_job_prio_priority_requested_at" in checked
    task = ok(cli(db_url, "task", "submit", "--actor", "user-a", "--name", "train",
                  "--tpu-type", "v6e", "--topology", "2x2",
                  "--image", "us-docker.pkg.dev/p/r/train:1", env=PRIORITY_ENV)).strip()
    one_line_failure(cli(db_url, "task", "set-priority", task, "50", env=PRIORITY_ENV),
                     EXIT_BAD_INPUT, f"task {task} is Pending (not taken in yet")
    app = open_app(Settings(db_url=db_url, job_mapping=prio.mapping), VirtualClock())
    try:
        build_service(app, None, RunOptions(handlers=(intake.accept_new_rows,))).controller.tick()
    finally:
        app.close()
    assert ok(cli(db_url, "task", "set-priority", task, "high", "--requester", "ops-bob",
                  env=PRIORITY_ENV)).startswith(f"{task}: priority 100 requested by ops-bob")
    with engine.connect() as conn:
        row = conn.execute(sa.select(prio.c.priority, prio.c.priority_requested_by)
                           .where(prio.c.id == task)).one()
    assert tuple(row) == (100, "ops-bob")
    one_line_failure(cli(db_url, "task", "set-priority", task, "500", env=PRIORITY_ENV),
                     EXIT_BAD_INPUT, "priority 500 is outside the range -100 to 100")
    one_line_failure(cli(db_url, "task", "set-priority", task, "urgent", env=PRIORITY_ENV),
                     EXIT_BAD_INPUT, "priority 'urgent'; expected a whole number from -100")
    one_line_failure(cli(db_url, "task", "set-priority", task, "5"), EXIT_BAD_INPUT,
                     "the job table job takes no priority requests")
    with engine.begin() as conn:
        conn.execute(prio.table.update().where(prio.c.id == task).values(status="Running",
                                                                         reason=None))
    engine.dispose()
    one_line_failure(cli(db_url, "task", "set-priority", task, "5", env=PRIORITY_ENV),
                     EXIT_BAD_INPUT, f"task {task} is Running (no longer waiting)")
