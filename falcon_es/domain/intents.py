"""The intent vocabulary: what a task asks of the world, and how far each request got.

Intent before effect: a handler never calls a port to change the world; it records an
intent event (``NodePoolCreateRequested``, ``JobSubmitRequested``, ``JobDeleteRequested``,
``NodePoolDeleteRequested``, ``OrphanPoolFound``). The effect executor carries out every
intent the log shows without an outcome, and the outcome is recorded as an event in
turn. What is open is derived from the folded task states (``task.task_intents``), so a
controller that starts after a crash re-issues whatever was left open.

The progress of a task's pool and Job requests (``PoolIntent``, ``JobIntent``) and the
fate of its pool once the task has ended (``PoolDisposition``) are named here, once, for
the fold that sets them and every reader that looks at them.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from falcon_es.domain import events as ev


class IntentKind(enum.StrEnum):
    """The effects the executor performs; each is also the step an ``ApiCallRetrying``
    names when its call failed."""

    POOL_CREATE = "pool-create"
    JOB_SUBMIT = "job-submit"
    JOB_DELETE = "job-delete"
    POOL_DELETE = "pool-delete"
    ORPHAN_DELETE = "orphan-delete"


#: Not an intent: the provisioning handler's read of a reservation's free capacity,
#: retried and recorded like the effects' calls.
RESERVATION_CHECK = "reservation-check"


class PoolIntent(enum.StrEnum):
    """How far the request for a task's own node pool got."""

    CREATE_REQUESTED = "create-requested"
    CREATE_STARTED = "create-started"
    READY = "ready"
    #: GKE refused the create before any pool existed: nothing to delete.
    NOT_CREATED = "not-created"
    #: The pool (or its create) failed after it existed: it still has to be deleted.
    FAILED = "failed"


class JobIntent(enum.StrEnum):
    """How far the request for a task's Job got."""

    SUBMIT_REQUESTED = "submit-requested"
    SUBMITTED = "submitted"
    SUBMIT_FAILED = "submit-failed"
    CANCELLED = "cancelled"
    FINISHED = "finished"
    DELETE_REQUESTED = "delete-requested"
    DELETED = "deleted"


#: Job intents after which no pod of the task occupies the pool's nodes: its pool may
#: be handed over or deleted (read by the deprovisioning and abort handlers).
JOB_GONE = frozenset({None, JobIntent.FINISHED, JobIntent.DELETED, JobIntent.CANCELLED,
                      JobIntent.SUBMIT_FAILED})


class PoolDisposition(enum.StrEnum):
    """What becomes of a task's pool once the task no longer runs on it."""

    RETAINED = "retained"
    DELETE_REQUESTED = "delete-requested"
    DELETE_FAILED = "delete-failed"
    DELETED = "deleted"


ORPHAN_STREAM_PREFIX = "orphans:"


def orphan_stream(cluster_id: str) -> str:
    """The stream recording the orphan sweeps of one cluster."""
    return f"{ORPHAN_STREAM_PREFIX}{cluster_id}"


@dataclasses.dataclass(frozen=True, order=True)
class Intent:
    """An effect the log asked for: what to do, for which stream, on which object."""

    kind: IntentKind
    stream_id: str
    name: str  # pool or Job name
    cluster_id: str


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happened when an intent was carried out: the event the next tick appends."""

    intent: Intent
    event: ev.Event
