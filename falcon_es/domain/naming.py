"""Deterministic names for what Falcon-ES creates outside its database.

A name is a pure function of the task id (and topology), so re-issuing an effect
after a crash addresses the same object: "already exists" then means "adopt it",
never "make another". Task ids come from the upper layer and may hold any
characters, so every name is checked against the rules of the place it goes to:

- GKE node pool: ``falcon-<short task id>-<topology>`` (``-s<i>`` added for the slices
  after the first of a multi-slice task), lowercase letters, digits
  and '-', starting with a letter, at most 40 characters;
- Kubernetes Job or JobSet: ``falcon-<short task id>``, a DNS-1123 label (at most 63; kept
  short so the pod names of an Indexed Job, ``<job>-<index>-<5 chars>``, stay labels);
- label value: at most 63 characters of ``[A-Za-z0-9._-]``, alphanumeric at both ends;
- log directory: one path segment under ``gs://<bucket>/logs/``.
"""

from __future__ import annotations

import hashlib
import re

POOL_PREFIX = "falcon-"
MAX_POOL_NAME = 40
MAX_JOB_NAME = 63
MAX_LABEL_VALUE = 63
#: A short id longer than this is shortened to a prefix plus a hash.
MAX_SHORT_ID = 16
_HASH_CHARS = 7

_SHORT_ID = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
_PATH_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_POOL_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
_SLICE_SUFFIX = "-s"
_SLICE_NAME = re.compile(r"^(.*)-s[1-9][0-9]*$")
_JOB_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class NamingError(ValueError):
    """A rendered name breaks the rules of the API it is meant for."""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:_HASH_CHARS]


def short_task_id(task_id: str) -> str:
    """The task id itself when it is short and already a valid name part, otherwise a
    readable prefix of its safe characters plus a hash of the whole id (two ids that
    differ anywhere get different short ids)."""
    if len(task_id) <= MAX_SHORT_ID and _SHORT_ID.match(task_id):
        return task_id
    safe = re.sub(r"[^a-z0-9]", "", task_id.lower())[: MAX_SHORT_ID - _HASH_CHARS - 1]
    return f"{safe}-{_digest(task_id)}" if safe else _digest(task_id)


def pool_name(task_id: str, topology: str) -> str:
    """``falcon-<short task id>-<topology>``: the pool a task creates."""
    name = f"{POOL_PREFIX}{short_task_id(task_id)}-{topology.lower()}"
    if not _POOL_NAME.match(name):
        raise NamingError(f"node pool name {name!r} breaks GKE's rules (task {task_id!r})")
    return name


def pool_group(first: str, slices: int) -> tuple[str, ...]:
    """The pools of a task of ``slices`` slices whose first pool is ``first`` (the
    single-slice name, so a one-slice task is unchanged): slice ``i`` is ``first``
    plus ``-s<i>``."""
    names = (first, *(f"{first}{_SLICE_SUFFIX}{i}" for i in range(1, slices)))
    for name in names[1:]:
        if not _POOL_NAME.match(name):
            raise NamingError(f"node pool name {name!r} breaks GKE's rules")
    return names


def group_first(name: str) -> str:
    """The first pool of the group a pool name belongs to (itself for a first pool)."""
    match = _SLICE_NAME.match(name)
    return match.group(1) if match else name


def job_name(task_id: str) -> str:
    """``falcon-<short task id>``: the Kubernetes Job that runs a task."""
    name = f"{POOL_PREFIX}{short_task_id(task_id)}"
    if len(name) > MAX_JOB_NAME or not _JOB_NAME.match(name):
        raise NamingError(f"Job name {name!r} is not a DNS-1123 label (task {task_id!r})")
    return name


def task_label(task_id: str) -> str:
    """The ``falcon-task`` label value: the id itself when it is a valid label value."""
    if _LABEL_VALUE.match(task_id):
        return task_id
    return short_task_id(task_id)


def log_dir(task_id: str) -> str:
    """The ``<job_id>`` segment of ``gs://<bucket>/logs/<job_id>/``: never a path that
    climbs out of ``logs/`` or nests deeper."""
    if _PATH_SEGMENT.match(task_id) and task_id not in (".", ".."):
        return task_id
    return short_task_id(task_id)


def is_falcon_pool(name: str) -> bool:
    return name.startswith(POOL_PREFIX)
