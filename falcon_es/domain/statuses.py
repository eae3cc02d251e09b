"""The Status and Pending Reason names a task can have, as the job table holds them.

They live apart from the state chart (``falcon_es.domain.chart``, which re-exports them) so
that what only reads or writes job rows by status (the upper layer's ``task``
commands) can name them without loading python-statemachine and compiling the chart.
"""

from __future__ import annotations

import enum

NEW = "New"
PENDING = "Pending"
RUNNING = "Running"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
ABORTING = "Aborting"
ABORTED = "Aborted"


class PendingReason(enum.StrEnum):
    """The sub-states of Pending, which the job table shows as the Reason."""

    WAITING = "Waiting"
    PROVISIONING = "Provisioning"
    CLUSTER_BUSY = "ClusterBusy"
    WAITING_FOR_NODE = "WaitingForNode"
    DISPATCHING = "Dispatching"


PENDING_REASONS = tuple(PendingReason)
TERMINAL_STATUSES = frozenset({SUCCEEDED, FAILED, ABORTED})
#: Pending sub-states in which a task is acquiring its pool: it holds its queue's
#: acquisition slot, and no Job is submitted yet.
ACQUIRING_REASONS = frozenset({PendingReason.PROVISIONING, PendingReason.CLUSTER_BUSY,
                               PendingReason.WAITING_FOR_NODE})
#: Pending sub-states that hold their queue's acquisition slot.
SLOT_REASONS = ACQUIRING_REASONS | {PendingReason.DISPATCHING}
