"""A task's log files, as ``falcon-es logs`` shows them.

Where they are comes from the log: the cluster the task was placed on (its bucket, from
the registry), the folder ``logs/<job_id>/`` and, when the task failed, the pod blamed
(``JobFailed.log_file``), shown first because that is the file its user wants. Each
file gets a header; ``follow`` reads every file again from where it stopped (a ranged
read from the last offset) until the task has ended, picking up the files of pods
started since (a retried pod writes a new file). The clock and the sleeper are passed
in, so a test follows a growing file without waiting.

On the gcp backend the files are Cloud Storage objects (``adapters.gcp.log_files``); on
the sim backend they are what the simulated pods wrote, read from the world saved in
the database (``adapters.sim.pod_logs``).
"""

from __future__ import annotations

import codecs
import dataclasses
import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from falcon_es.domain import events as ev
from falcon_es.domain import naming
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.ports import LogFiles, LogObject
from falcon_es.domain.timestamps import as_timestamp

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from falcon_es.config.settings import Settings
    from falcon_es.domain.clock import Clock
    from falcon_es.storage.store import RecordedEvent


class LogsError(Exception):
    """Why a task's logs cannot be shown, in one line."""


@dataclasses.dataclass(frozen=True)
class LogTarget:
    """Where a task's pods wrote: the bucket, the folder, and the pod blamed."""

    task_id: str
    bucket: str
    prefix: str
    failed_pod: str = ""

    def url(self, name: str) -> str:
        return f"gs://{self.bucket}/{name}"


@dataclasses.dataclass(frozen=True)
class Choice:
    """Which of the task's files to show: one pod by name, the pods of one completion
    index, or all; and only files written to at or after ``since`` (the files of an
    earlier attempt's pods are left out)."""

    pod: str | None = None
    index: int | None = None
    since: dt.datetime | None = None


def target_of(task_id: str, records: Sequence[RecordedEvent],
              clusters: Mapping[str, Cluster]) -> LogTarget:
    """The task's log folder, from its events and the registry; LogsError when the
    task was never placed on a cluster (no pod of it ever ran)."""
    placed = [(r.event.cluster_id, r.event.cluster_name) if isinstance(r.event, ev.ClusterChosen)
              else (r.event.to_cluster_id, r.event.to_cluster_name)
              for r in records if isinstance(r.event, (ev.ClusterChosen, ev.TaskMoved))]
    if not placed:
        raise LogsError(f"task {task_id} was never placed on a cluster: no pod of it ran, "
                        "so it has no log files")
    cluster_id, cluster_name = placed[-1]
    cluster = clusters.get(cluster_id)
    if cluster is None:
        raise LogsError(f"task {task_id} ran on cluster {cluster_name}, which is no longer "
                        "registered: its log bucket is unknown")
    failed = [r.event for r in records if isinstance(r.event, ev.JobFailed)]
    blamed = pod_of(failed[-1].log_file) if failed and failed[-1].log_file else ""
    return LogTarget(task_id, cluster.gcs_bucket, f"logs/{naming.log_dir(task_id)}/", blamed)


def pod_of(name: str) -> str:
    """The pod a log object belongs to: its file name without ``.log``."""
    return name.rsplit("/", 1)[-1].removesuffix(".log")


def chosen(objects: Sequence[LogObject], target: LogTarget, choice: Choice) -> list[LogObject]:
    """The files to show, the failed pod's first, then by name."""
    picked = [o for o in objects if o.name.endswith(".log")]
    if choice.pod is not None:
        picked = [o for o in picked if pod_of(o.name) == choice.pod]
    if choice.index is not None:
        ending = re.compile(rf"-{choice.index}-[a-z0-9]+$")
        picked = [o for o in picked if ending.search(pod_of(o.name))]
    if choice.since is not None:
        since = choice.since
        picked = [o for o in picked if o.updated is None or o.updated >= since]
    return sorted(picked, key=lambda o: (pod_of(o.name) != target.failed_pod, o.name))


@dataclasses.dataclass
class Follower:
    """Prints a task's files and, with ``follow``, what is added to them until
    ``ended()`` says the task has ended (then one last read, so nothing is lost)."""

    files: LogFiles
    target: LogTarget
    choice: Choice
    echo: Callable[[str], None]
    ended: Callable[[], bool]
    sleep: Callable[[float], None]
    poll_seconds: float = 2.0
    offsets: dict[str, int] = dataclasses.field(default_factory=dict)
    _decoders: dict[str, codecs.IncrementalDecoder] = dataclasses.field(default_factory=dict)
    _current: str | None = None

    def run(self, follow: bool) -> int:
        """Show the files; returns how many there were. LogsError when there are none."""
        shown = self.read_all()
        if not shown and not follow:
            raise LogsError(self._none_message())
        while follow:
            finished = self.ended()
            shown = max(shown, self.read_all())
            if finished:
                break
            self.sleep(self.poll_seconds)
        if not shown:
            raise LogsError(self._none_message())
        return shown

    def read_all(self) -> int:
        objects = chosen(self.files.list(self.target.bucket, self.target.prefix),
                         self.target, self.choice)
        for obj in objects:
            self._read(obj)
        return len(objects)

    def _read(self, obj: LogObject) -> None:
        start = self.offsets.get(obj.name)
        if start is not None and obj.size <= start:
            return
        data = self.files.read(self.target.bucket, obj.name, start or 0)
        decoder = self._decoders.setdefault(obj.name, codecs.getincrementaldecoder("utf-8")("replace"))
        if start is None or (data and self._current != obj.name):
            self.echo(self._header(obj.name))
            self._current = obj.name
        self.offsets[obj.name] = (start or 0) + len(data)
        text = decoder.decode(data)
        if text:
            self.echo(text.removesuffix("\n"))

    def _header(self, name: str) -> str:
        failed = " (the pod that failed)" if pod_of(name) == self.target.failed_pod else ""
        return f"==> {self.target.url(name)}{failed} <=="

    def _none_message(self) -> str:
        where = self.target.url(self.target.prefix)
        if self.choice.pod is not None:
            return f"{where}{self.choice.pod}.log: no such log file"
        if self.choice.index is not None:
            return f"{where}: no log file of a pod of index {self.choice.index}"
        if self.choice.since is not None:
            return f"{where}: no log file written since {self.choice.since.isoformat()}"
        return (f"{where}: no log files (no pod started yet, or the task has no command: "
                "its output is then in the pod log only)")


def parse_since(text: str, now: dt.datetime) -> dt.datetime:
    """``--since``: an ISO time (naive is UTC) or a duration back from now (30s, 10m, 2h,
    1d)."""
    match = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if match:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[match.group(2)]
        return now - dt.timedelta(**{unit: int(match.group(1))})
    moment = as_timestamp(text)
    if moment is None:
        raise LogsError(f"--since {text!r}: expected a duration (30s, 10m, 2h, 1d) or an ISO "
                        "time such as 2026-11-29T12:00:00")
    return moment


def log_files_for(settings: Settings, engine: Engine, clusters: Sequence[Cluster],
                  clock: Clock) -> LogFiles:
    """The backend's log files: Cloud Storage on gcp; on sim, the world saved in the
    database (LogsError when none is)."""
    if settings.run.backend == "gcp":
        from falcon_es.adapters.gcp.log_files import gcs_log_files

        return gcs_log_files(settings)
    from falcon_es.adapters.sim.persist import SavedWorldError, WorldStore
    from falcon_es.adapters.sim.pod_logs import SimLogFiles, SimPodLogs

    buckets: dict[str, list[str]] = {}
    for cluster in clusters:
        buckets.setdefault(cluster.gcs_bucket, []).append(cluster.name)

    def saved_world() -> SimLogFiles:
        try:
            world = WorldStore(engine).load(clock)
        except SavedWorldError as error:
            raise LogsError(str(error)) from error
        if world is None:
            raise LogsError("no simulated world is saved in this database, so the simulated "
                            "pods' logs are gone: run `falcon-es demo`, or `falcon-es run "
                            "--backend sim` with --sim-snapshot-every, or set "
                            "FALCON_BACKEND=gcp")
        simulated = set(world.simulated())

        def cluster_logs(name: str) -> SimPodLogs | None:
            if name not in simulated:
                return None
            logs: SimPodLogs | None = getattr(world.cluster(name).kube, "pod_logs", None)
            return logs  # None: a world saved before its pods kept log files

        return SimLogFiles(buckets, cluster_logs)

    return _Reloaded(saved_world)


class _Reloaded:
    """The sim's log files as the saved world holds them at each listing: a controller
    running beside ``logs --follow`` saves its world with every commit."""

    def __init__(self, load: Callable[[], LogFiles]) -> None:
        self._load = load
        self._files = load()

    def list(self, bucket: str, prefix: str) -> Sequence[LogObject]:
        self._files = self._load()
        return self._files.list(bucket, prefix)

    def read(self, bucket: str, name: str, start: int = 0) -> bytes:
        return self._files.read(bucket, name, start)


__all__ = ["Choice", "Follower", "LogTarget", "LogsError", "chosen",
           "log_files_for", "parse_since", "target_of"]
