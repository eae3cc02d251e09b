"""Task states built by hand: a test names the fields it sets, flat, as a row shows
them, and these put each one in its record of ``TaskState``."""

from __future__ import annotations

import dataclasses
from typing import Any

from falcon_es.domain.task import TaskState

#: Each flat name a test may set: the record of ``TaskState`` that holds it, and its
#: name there.
RECORD_OF: dict[str, tuple[str, str]] = {
    **{name: ("submission", name) for name in (
        "name", "actor", "spec", "tpu_type", "topology", "submitted_at", "priority")},
    **{name: ("placement", name) for name in ("cluster_id", "cluster_name", "moves")},
    "node_pool_name": ("pool", "name"), "supply_mode": ("pool", "supply_mode"),
    "pool_intent": ("pool", "intent"), "pool_requested_at": ("pool", "requested_at"),
    "pool_request": ("pool", "request"), "pool_operation": ("pool", "operation"),
    "slice_operations": ("pool", "slice_operations"),
    "slices_requested": ("pool", "slices_requested"), "pool_from_task": ("pool", "from_task"),
    "taken_pools": ("pool", "taken_pools"), "taken_from": ("pool", "taken_from"),
    "taken_slices": ("pool", "taken_slices"), "pool_disposition": ("pool", "disposition"),
    "pools_retained": ("pool", "retained"), "pools_handed_over": ("pool", "handed_over"),
    "pools_deleting": ("pool", "deleting"),
    "job_name": ("job", "name"), "job_uid": ("job", "uid"), "job_intent": ("job", "intent"),
    **{name: ("job", name) for name in (
        "dispatched_at", "last_resource_version", "pods_active", "pending_diagnosis",
        "refused_since", "awaiting_nodes_since", "wait_extended_at")},
    "retry_kind": ("retries", "kind"), "retry_attempt": ("retries", "attempt"),
    "retry_at": ("retries", "at"), "api_retries": ("retries", "api_calls"),
    "not_visible_since": ("retries", "not_visible_since"),
    **{name: ("ending", name) for name in (
        "aborting_at", "abort_phase", "aborted_at", "finished_at", "failure_reason")},
}


def replaced(task: TaskState, /, **changes: Any) -> TaskState:
    """``task`` with ``changes``: a TaskState field by its name, a record's field by
    its flat name (``RECORD_OF``)."""
    own: dict[str, Any] = {}
    per_record: dict[str, dict[str, Any]] = {}
    for flat, value in changes.items():
        if flat in RECORD_OF:
            record, name = RECORD_OF[flat]
            per_record.setdefault(record, {})[name] = value
        else:
            own[flat] = value
    for record, values in per_record.items():
        own[record] = dataclasses.replace(getattr(task, record), **values)
    return dataclasses.replace(task, **own)


def task_state(task_id: str, **fields: Any) -> TaskState:
    """``TaskState(task_id)`` with ``fields`` set as ``replaced`` sets them."""
    return replaced(TaskState(task_id), **fields)
