"""Deterministic names for what Falcon-ES creates outside its database, and whose an
object is.

A name is a pure function of the task id (and topology), so re-issuing an effect
after a crash addresses the same object: "already exists" then means "adopt it",
never "make another" -- but only when the object is this task's, which is decided on
the full task id (``owned_by``), never on a name or a shortened label. Task ids come
from the upper layer and may hold any characters, so every name is checked against
the rules of the place it goes to:

- GKE node pool: ``falcon-<short task id>-<topology>`` (``-s<i>`` added for the slices
  after the first of a multi-slice task), lowercase letters, digits
  and '-', starting with a letter, at most 40 characters;
- Kubernetes Job or JobSet: ``falcon-<short task id>``, a DNS-1123 label (at most 63; kept
  short so the pod names of an Indexed Job, ``<job>-<index>-<5 chars>``, and a JobSet's
  pod host names, ``<jobset>-slice-<i>-<index>``, stay labels);
- label value: at most 63 characters of ``[A-Za-z0-9._-]``, alphanumeric at both ends;
- log directory: one path segment under ``gs://<bucket>/logs/``.

The short task id keeps 65 bits of a SHA-256 of the whole id, labels and log
directories 130 bits; the figures and the birthday bounds are in
``docs/reference/naming.md``.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import re

POOL_PREFIX = "falcon-"
MAX_POOL_NAME = 40
MAX_JOB_NAME = 63
MAX_LABEL_VALUE = 63
#: Hash characters (base32: 5 bits each) in a short task id (pool, Job, JobSet and
#: Service names): 65 bits.
NAME_HASH_CHARS = 13
#: Hash characters in a shortened label value or log directory: 130 bits.
LABEL_HASH_CHARS = 26
#: The longest short task id: ``falcon-<20>-<topology of <= 8>-s<slice>`` fits 40.
MAX_SHORT_ID = 20
#: An id this short that is already a valid name part is used as it is: shorter than
#: any hashed form, so a verbatim id never equals another id's hashed one.
MAX_VERBATIM_ID = NAME_HASH_CHARS - 1

_SHORT_ID = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
_PATH_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_POOL_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
_SLICE_SUFFIX = "-s"
_SLICE_NAME = re.compile(r"^(.*)-s[1-9][0-9]*$")
_JOB_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
#: Before names kept 65 bits: a short id of at most 16 characters, 7 hex digits of hash.
_LEGACY_SHORT_ID, _LEGACY_HASH_CHARS = 16, 7


class NamingError(ValueError):
    """A rendered name breaks the rules of the API it is meant for."""


def _digest(text: str, chars: int) -> str:
    """``chars`` lowercase base32 characters of the id's SHA-256 (5 bits each)."""
    raw = hashlib.sha256(text.encode("utf-8")).digest()
    return base64.b32encode(raw).decode("ascii").lower()[:chars]


def _hashed(task_id: str, length: int, hash_chars: int) -> str:
    """A readable prefix of the id's safe characters plus a hash of the whole id."""
    safe = re.sub(r"[^a-z0-9]", "", task_id.lower())[: length - hash_chars - 1]
    digest = _digest(task_id, hash_chars)
    return f"{safe}-{digest}" if safe else digest


def short_task_id(task_id: str) -> str:
    """The task id itself when it is short and already a valid name part, otherwise a
    readable prefix of its safe characters plus 65 bits of a hash of the whole id."""
    if len(task_id) <= MAX_VERBATIM_ID and _SHORT_ID.match(task_id):
        return task_id
    return _hashed(task_id, MAX_SHORT_ID, NAME_HASH_CHARS)


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
    if slices <= 1:
        return (first,)  # most tasks: nothing to name or check
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
    return _hashed(task_id, MAX_LABEL_VALUE, LABEL_HASH_CHARS)


def log_dir(task_id: str) -> str:
    """The ``<job_id>`` segment of ``gs://<bucket>/logs/<job_id>/``: never a path that
    climbs out of ``logs/`` or nests deeper."""
    if _PATH_SEGMENT.match(task_id) and task_id not in (".", ".."):
        return task_id
    return _hashed(task_id, MAX_LABEL_VALUE, LABEL_HASH_CHARS)


def is_falcon_pool(name: str) -> bool:
    return name.startswith(POOL_PREFIX)


def owner_digest(task_id: str) -> str:
    """The whole SHA-256 of the task id (52 base32 characters, a valid label value):
    what a node pool carries to name its task, since a pool has labels only (no
    annotations) and a label cannot hold every id."""
    return _digest(task_id, 52)


def legacy_task_label(task_id: str) -> str:
    """The ``falcon-task`` label value before names kept 65 bits (a 16-character short
    id with 28 bits of hash): what pools and Services made then carry."""
    if _LABEL_VALUE.match(task_id):
        return task_id
    if len(task_id) <= _LEGACY_SHORT_ID and _SHORT_ID.match(task_id):
        return task_id
    safe = re.sub(r"[^a-z0-9]", "", task_id.lower())[: _LEGACY_SHORT_ID - _LEGACY_HASH_CHARS - 1]
    digest = hashlib.sha256(task_id.encode("utf-8")).hexdigest()[:_LEGACY_HASH_CHARS]
    return f"{safe}-{digest}" if safe else digest


@dataclasses.dataclass(frozen=True)
class OwnerMarks:
    """What an object Falcon made says about its task: the full id (a Job's, JobSet's
    or Service's ``falcon/task-id`` annotation), the id's whole hash (a node pool's
    ``falcon-task-sha256`` label), and the ``falcon-task`` label (maybe shortened)."""

    task_id: str | None = None
    digest: str | None = None
    label: str | None = None


def owned_by(marks: OwnerMarks, task_id: str) -> bool:
    """Whether the object is this task's. Decided on the full id, or on its whole
    SHA-256 where only a label can hold it; an object made before either was written
    (no annotation, no digest) is recognised by the label of that time."""
    if marks.task_id is not None:
        return marks.task_id == task_id
    if marks.digest is not None:
        return marks.digest == owner_digest(task_id)
    return marks.label is not None and marks.label == legacy_task_label(task_id)
