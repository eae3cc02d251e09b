"""``falcon-es logs``: a task's log files read with Google's ``google-cloud-storage``
from a Cloud Storage emulator (and refusals from a front end that answers 403 as Cloud
Storage does), following a file that grows; on the sim backend, the demo's simulated
pods' lines; and the failed task's Message and explain naming the blamed pod's file."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from falcon_es.adapters.gcp.log_files import GcsLogFiles
from falcon_es.adapters.sim.pod_logs import SimLogFiles, SimPodLogs
from falcon_es.app.demo import run_demo
from falcon_es.app.task_logs import Choice, Follower, LogsError, LogTarget, chosen, parse_since
from falcon_es.cli import EXIT_PROBLEM, main
from falcon_es.domain.ports import NOT_FOUND, PERMISSION_DENIED, LogObject, PortError
from falcon_es.jobtable import job_rows
from falcon_es.storage import db, tables
from falcon_es.storage.tables import JobTable
from tests.fakes import storage_emulator
from tests.test_cli import one_line_failure

DEMO_BUCKET = "falcon-demo-logs"


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The demo's database (its world saved beside the log), made once."""
    path = tmp_path_factory.mktemp("demo") / "demo.db"
    run_demo(path, echo=lambda _line: None)
    return f"sqlite:///{path}"


@pytest.fixture(scope="module")
def gcs() -> Iterator[str]:
    with storage_emulator.storage_emulator() as host:
        yield host


def logs(db_url: str, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner(env=env).invoke(main, ["--db", db_url, "logs", *args])


def demo_pod(db_url: str, task_id: str) -> str:
    """The pod the demo's failed task blames, from its Message."""
    row = job_rows.get_row(db.make_engine(db_url), task_id, job=JobTable())
    found = re.search(rf"gs://{DEMO_BUCKET}/logs/{task_id}/([a-z0-9-]+)\.log", row["message"])
    assert found, row["message"]
    return found.group(1)


# ------------------------------------------------------------------ the GCS adapter


def test_lists_and_reads_from_an_offset(gcs: str) -> None:
    client = storage_emulator.client(gcs)
    bucket = client.create_bucket("logs-ranged")
    bucket.blob("logs/t1/job-0-aaaaa.log").upload_from_string(b"one\ntwo\n")
    bucket.blob("logs/t2/job-0-bbbbb.log").upload_from_string(b"other task\n")
    files = GcsLogFiles(client)
    listed = files.list("logs-ranged", "logs/t1/")
    assert [(o.name, o.size) for o in listed] == [("logs/t1/job-0-aaaaa.log", 8)]
    assert listed[0].updated is not None and listed[0].updated.tzinfo is None
    assert files.read("logs-ranged", "logs/t1/job-0-aaaaa.log") == b"one\ntwo\n"
    assert files.read("logs-ranged", "logs/t1/job-0-aaaaa.log", 4) == b"two\n"
    assert files.read("logs-ranged", "logs/t1/job-0-aaaaa.log", 8) == b""  # 416: nothing new


def test_a_missing_bucket_or_object_is_named(gcs: str) -> None:
    files = GcsLogFiles(storage_emulator.client(gcs))
    with pytest.raises(PortError) as missing_bucket:
        files.list("no-such-bucket", "logs/t1/")
    assert missing_bucket.value.code == NOT_FOUND
    assert missing_bucket.value.message.startswith("bucket no-such-bucket does not exist")
    storage_emulator.client(gcs).create_bucket("logs-empty")
    with pytest.raises(PortError) as missing_object:
        files.read("logs-empty", "logs/t1/gone.log")
    assert missing_object.value.code == NOT_FOUND
    assert missing_object.value.message.startswith("gs://logs-empty/logs/t1/gone.log: no such")


def _list(files: GcsLogFiles) -> object:
    return files.list("logs-b", "logs/t1/")


def _read(files: GcsLogFiles) -> object:
    return files.read("logs-b", "logs/t1/p.log")


@pytest.mark.parametrize(("call", "permission"), [
    (_list, "storage.objects.list"), (_read, "storage.objects.get")])
def test_a_refusal_names_the_permission_missing(call: Callable[[GcsLogFiles], object],
                                                permission: str) -> None:
    with storage_emulator.forbidding_storage() as host:
        with pytest.raises(PortError) as refused:
            call(GcsLogFiles(storage_emulator.client(host)))
    assert refused.value.code == PERMISSION_DENIED
    assert f"the caller needs {permission} on bucket logs-b" in refused.value.message
    assert "does not have" in refused.value.message  # Cloud Storage's own words kept


# ------------------------------------------------------------------ following


def test_follow_reads_what_a_growing_file_gains_until_the_task_ends(gcs: str) -> None:
    client = storage_emulator.client(gcs)
    bucket = client.create_bucket("logs-follow")
    blob = bucket.blob("logs/t9/job-0-zzzzz.log")
    content = [b"step 1\n"]
    blob.upload_from_string(b"".join(content))
    printed: list[str] = []
    polls: list[float] = []

    def sleep(seconds: float) -> None:
        """The pod writes between two polls; a retried pod starts a file of its own."""
        polls.append(seconds)
        content.append(f"step {len(content) + 1}\n".encode())
        blob.upload_from_string(b"".join(content))  # gcsfuse flushes: a new generation
        if len(polls) == 2:
            bucket.blob("logs/t9/job-0-yyyyy.log").upload_from_string(b"retry\n")

    target = LogTarget("t9", "logs-follow", "logs/t9/")
    follower = Follower(GcsLogFiles(client), target, Choice(), printed.append,
                        ended=lambda: len(polls) >= 3, sleep=sleep, poll_seconds=0.5)
    assert follower.run(follow=True) == 2
    assert polls == [0.5, 0.5, 0.5]
    first = "==> gs://logs-follow/logs/t9/job-0-zzzzz.log <=="
    second = "==> gs://logs-follow/logs/t9/job-0-yyyyy.log <=="
    assert printed == [first, "step 1", "step 2", second, "retry", first, "step 3", "step 4"]


def test_follow_that_finds_no_file_until_the_end_says_so() -> None:
    """A task that ends before any of its pods wrote a file (an image that never
    pulled): --follow stops with the task and says there was nothing."""
    files = SimLogFiles({"b": ["gke-a"]}, lambda _name: SimPodLogs())
    polls: list[float] = []
    follower = Follower(files, LogTarget("t", "b", "logs/t/"), Choice(), print,
                        ended=lambda: len(polls) >= 2, sleep=polls.append)
    with pytest.raises(LogsError, match="gs://b/logs/t/: no log files"):
        follower.run(follow=True)
    assert len(polls) == 2


def test_the_failed_pod_comes_first_and_choices_narrow() -> None:
    objects = [LogObject(f"logs/t/job-{i}-abcde.log", 1) for i in range(3)]
    target = LogTarget("t", "b", "logs/t/", failed_pod="job-2-abcde")
    assert [o.name for o in chosen(objects, target, Choice())] == [
        "logs/t/job-2-abcde.log", "logs/t/job-0-abcde.log", "logs/t/job-1-abcde.log"]
    assert [o.name for o in chosen(objects, target, Choice(index=1))] == ["logs/t/job-1-abcde.log"]
    assert chosen(objects, target, Choice(pod="job-9-abcde")) == []


def test_since_takes_a_duration_or_a_time() -> None:
    import datetime as dt

    now = dt.datetime(2026, 1, 5, 12, 0)
    assert parse_since("90m", now) == dt.datetime(2026, 1, 5, 10, 30)
    assert parse_since("2026-01-05T13:00:00+02:00", now) == dt.datetime(2026, 1, 5, 11, 0)
    with pytest.raises(LogsError, match="--since 'soon'"):
        parse_since("soon", now)


# ------------------------------------------------------------------ the command, gcp backend


def test_logs_command_reads_the_bucket_failed_pod_first(demo_db: str, gcs: str) -> None:
    pod = demo_pod(demo_db, "t03")
    bucket = storage_emulator.client(gcs).create_bucket(DEMO_BUCKET)
    bucket.blob("logs/t03/falcon-t03-0-other.log").upload_from_string(b"a sibling\n")
    bucket.blob(f"logs/t03/{pod}.log").upload_from_string(b"Traceback...\nMemoryError\n")
    env = {"FALCON_BACKEND": "gcp", "STORAGE_EMULATOR_HOST": gcs}
    result = logs(demo_db, "t03", env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"==> gs://{DEMO_BUCKET}/logs/t03/{pod}.log (the pod that failed) <==",
        "Traceback...", "MemoryError",
        f"==> gs://{DEMO_BUCKET}/logs/t03/falcon-t03-0-other.log <==", "a sibling"]
    only = logs(demo_db, "t03", "--pod", "falcon-t03-0-other", env=env)
    assert only.stdout.splitlines() == [
        f"==> gs://{DEMO_BUCKET}/logs/t03/falcon-t03-0-other.log <==", "a sibling"]
    one_line_failure(logs(demo_db, "t12", env=env), EXIT_PROBLEM,
                     "gs://falcon-demo-logs/logs/t12/: no log files")


def test_logs_command_says_which_bucket_is_missing(demo_db: str) -> None:
    with storage_emulator.storage_emulator() as empty:  # no bucket at all
        env = {"FALCON_BACKEND": "gcp", "STORAGE_EMULATOR_HOST": empty}
        one_line_failure(logs(demo_db, "t02", env=env), EXIT_PROBLEM,
                         f"bucket {DEMO_BUCKET} does not exist")
    with storage_emulator.forbidding_storage() as refusing:
        env = {"FALCON_BACKEND": "gcp", "STORAGE_EMULATOR_HOST": refusing}
        line = one_line_failure(logs(demo_db, "t02", env=env), EXIT_PROBLEM,
                                f"gs://{DEMO_BUCKET}/logs/t02/: Cloud Storage refused")
    assert "storage.objects.list" in line


# ------------------------------------------------------------------ the command, sim backend


def test_sim_backend_shows_what_the_demo_pods_wrote(demo_db: str) -> None:
    pod = demo_pod(demo_db, "t03")
    result = logs(demo_db, "t03")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"==> gs://{DEMO_BUCKET}/logs/t03/{pod}.log (the pod that failed) <=="
    assert f"pod {pod} started on node" in lines[1]
    assert lines[2].endswith("OOMKilled: container main was OOMKilled: it exceeded its memory "
                             "limit (exit code 137)")
    four_hosts = logs(demo_db, "t07")
    assert four_hosts.stdout.count("==> ") == 4 and four_hosts.stdout.count("exited with code 0") == 4
    index_two = logs(demo_db, "t07", "--index", "2").stdout.splitlines()
    assert len(index_two) == 3 and re.match(r"==> .*/falcon-t07-2-[a-z0-9]+\.log <==", index_two[0])


def test_sim_backend_failures_are_one_line(demo_db: str, db_url: str) -> None:
    one_line_failure(logs(demo_db, "t06"), EXIT_PROBLEM, "task t06 was never placed on a cluster")
    one_line_failure(logs(demo_db, "t07", "--pod", "nope"), EXIT_PROBLEM,
                     f"gs://{DEMO_BUCKET}/logs/t07/nope.log: no such log file")
    one_line_failure(logs(demo_db, "t07", "--since", "2030-01-01T00:00:00"), EXIT_PROBLEM,
                     f"gs://{DEMO_BUCKET}/logs/t07/: no log file written since 2030-01-01")
    one_line_failure(logs(demo_db, "t07", "--pod", "a", "--index", "1"), 2, "--pod and --index")
    one_line_failure(logs(db_url, "t404"), 2, "")  # an unknown task, in the job table's words


def test_without_a_saved_world_the_sim_logs_are_gone(demo_db: str, tmp_path: Path) -> None:
    copy = tmp_path / "no-world.db"
    shutil.copyfile(demo_db.removeprefix("sqlite:///"), copy)
    engine = db.make_engine(f"sqlite:///{copy}")
    with engine.begin() as conn:
        for table in (tables.sim_world_changes, tables.sim_world_objects, tables.sim_worlds):
            conn.execute(table.delete())
    engine.dispose()
    one_line_failure(logs(f"sqlite:///{copy}", "t03"), EXIT_PROBLEM,
                     "no simulated world is saved in this database")


def test_message_and_explain_name_the_blamed_pods_log(demo_db: str) -> None:
    pod = demo_pod(demo_db, "t12")
    explained = CliRunner().invoke(main, ["--db", demo_db, "explain", "t12"]).stdout
    assert "pod failed: exit code 3" in explained
    assert f"its output: gs://{DEMO_BUCKET}/logs/t12/{pod}.log (falcon-es logs)" in explained
