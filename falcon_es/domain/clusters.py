"""A registered cluster as the controller sees it: its record, its statuses, its stream.

The record is a plain value the scheduling policy, the ports and the adapters read; the
rows it comes from live in ``falcon_es.storage.registry``.

GKE keeps two places apart (docs/design-notes/regional-clusters.md): the cluster's own
``location`` (a region for a regional cluster, a zone for a zonal one) addresses every
GKE call, and the zone its TPU pools go in (``NodePool.locations``) is where Compute's
zonal reservations are read. ``node_location`` is that zone; a zonal cluster's is its
location.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import Any

CLUSTER_STATUSES = ("active", "maintenance", "offline")
#: A Compute Engine zone (``us-central1-a``) and region (``us-central1``).
ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z][a-z0-9]*$")
REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
NODE_LOCATION_FLAG = "--node-location"
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
    #: The zone the cluster's TPU pools go in; None in a registry row written before
    #: the zone was kept, where ``node_zone`` falls back to a zonal location.
    node_location: str | None = None

    @property
    def stream_id(self) -> str:
        return cluster_stream(self.id)

    @property
    def regional(self) -> bool:
        return not is_zone(self.location)

    @property
    def kind(self) -> str:
        return "regional" if self.regional else "zonal"

    @property
    def node_zone(self) -> str | None:
        """Where its TPU pools and reservations are: None only for a regional cluster
        registered before the node zone was kept (it must be given one)."""
        if self.node_location:
            return self.node_location
        return None if self.regional else self.location

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["created_at"] = self.created_at.isoformat()
        data["node_location"] = self.node_zone
        return data


def cluster_stream(cluster_id: str) -> str:
    return f"cluster:{cluster_id}"


def is_zone(location: str) -> bool:
    return bool(ZONE.match(location))


def region_of(location: str) -> str:
    return location.rsplit("-", 1)[0] if is_zone(location) else location


def missing_node_zone(name: str, location: str) -> str:
    return (f"cluster {name} is regional ({location}): give the zone its TPU pools go in "
            f"with {NODE_LOCATION_FLAG} ZONE (e.g. {location}-a)")


def node_location_for(name: str, location: str, node_location: str | None) -> str:
    """The node zone a registration keeps, or a RegistryError saying why not: a zonal
    cluster's nodes are in its zone; a regional one's zone must be named and lie in
    its region."""
    if not (is_zone(location) or REGION.match(location)):
        raise RegistryError(f"cluster {name}: location {location!r} is neither a zone "
                            "(us-central1-a) nor a region (us-central1)")
    if node_location is None:
        if not is_zone(location):
            raise RegistryError(missing_node_zone(name, location))
        return location
    if not is_zone(node_location):
        raise RegistryError(f"cluster {name}: {NODE_LOCATION_FLAG} {node_location!r} is not "
                            "a zone (us-central1-a): TPU pools and reservations are zonal")
    if is_zone(location) and node_location != location:
        raise RegistryError(f"cluster {name} is zonal ({location}): its nodes are in "
                            f"{location}, not {node_location}")
    if region_of(node_location) != region_of(location):
        raise RegistryError(f"cluster {name}: zone {node_location} is not in the cluster's "
                            f"region {region_of(location)}")
    return node_location
