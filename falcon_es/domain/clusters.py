"""A registered cluster as the controller sees it: its record, its statuses, its stream.

The record is a plain value the scheduling policy, the ports and the adapters read; the
rows it comes from live in ``falcon_es.storage.registry``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import Any

CLUSTER_STATUSES = ("active", "maintenance", "offline")
#: What GKE accepts as a cluster name (lower case, digits and dashes, at most 40).
CLUSTER_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")


class RegistryError(ValueError):
    """A cluster registry request that cannot be carried out (says why)."""


@dataclasses.dataclass(frozen=True)
class Cluster:
    id: str
    name: str
    project: str
    location: str
    tpu_type: str
    gcs_bucket: str
    default_reservation: str | None
    status: str
    created_at: dt.datetime

    @property
    def stream_id(self) -> str:
        return cluster_stream(self.id)

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["created_at"] = self.created_at.isoformat()
        return data


def cluster_stream(cluster_id: str) -> str:
    return f"cluster:{cluster_id}"
