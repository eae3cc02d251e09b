"""What the simulated pods write to their log files, and the ``LogFiles`` port over it.

A real task's pod writes its stdout and stderr to
``gs://<bucket>/logs/<job_id>/<pod_name>.log`` through GCS FUSE (``domain.manifests``).
A simulated pod runs no command, so it writes what the log wrapper and the kubelet
would make visible: when it started, on which node of which pool, and how it ended
(exit code, OOM kill). Each cluster's API keeps the files of its pods
(``KubeService.pod_logs``), saved with the world, so ``falcon-es logs`` can read a
finished demo's tasks from its database.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence

from falcon_es.domain import naming
from falcon_es.domain.ports import NOT_FOUND, LogObject, PortError


def object_name(task_id: str, pod_name: str) -> str:
    """The pod's log file in its cluster's bucket, as the log wrapper names it."""
    return f"logs/{naming.log_dir(task_id)}/{pod_name}.log"


class SimPodLogs:
    """One cluster's pod log files: object name -> the lines written so far."""

    def __init__(self) -> None:
        self.files: dict[str, list[str]] = {}
        #: object name -> when it was last written.
        self.updated: dict[str, dt.datetime] = {}

    def write(self, task_id: str, pod_name: str, moment: dt.datetime, text: str) -> None:
        name = object_name(task_id, pod_name)
        stamp = moment.replace(tzinfo=None).isoformat(timespec="seconds")
        self.files.setdefault(name, []).append(f"{stamp}Z {text}")
        self.updated[name] = moment.replace(tzinfo=None)

    def content(self, name: str) -> bytes | None:
        lines = self.files.get(name)
        return None if lines is None else "".join(f"{line}\n" for line in lines).encode()


class SimLogFiles:
    """``LogFiles`` over a simulated world: ``buckets`` maps each registered cluster's
    bucket to the names of the clusters that write there (clusters may share one), and
    ``cluster_logs(name)`` gives a cluster's pod logs (None when the world never
    simulated it). A bucket no cluster has does not exist."""

    def __init__(self, buckets: Mapping[str, Sequence[str]],
                 cluster_logs: Callable[[str], SimPodLogs | None]) -> None:
        self._buckets = {bucket: tuple(names) for bucket, names in buckets.items()}
        self._cluster_logs = cluster_logs

    def list(self, bucket: str, prefix: str) -> Sequence[LogObject]:
        found = [LogObject(name, len(logs.content(name) or b""), logs.updated.get(name))
                 for logs in self._logs(bucket) for name in logs.files if name.startswith(prefix)]
        return sorted(found, key=lambda o: o.name)

    def read(self, bucket: str, name: str, start: int = 0) -> bytes:
        for logs in self._logs(bucket):
            content = logs.content(name)
            if content is not None:
                return content[start:]
        raise PortError(NOT_FOUND, f"gs://{bucket}/{name}: no such object")

    def _logs(self, bucket: str) -> tuple[SimPodLogs, ...]:
        names = self._buckets.get(bucket)
        if names is None:
            raise PortError(NOT_FOUND, f"bucket {bucket} does not exist")
        return tuple(logs for name in names if (logs := self._cluster_logs(name)) is not None)
