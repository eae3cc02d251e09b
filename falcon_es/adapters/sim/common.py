"""What the simulated GKE and Kubernetes sides of one cluster share: its identity, its
seeded random streams, and the API's validation rules (so a bad name or label fails
here the way it would against the real API); and how the port adapters over them run
a call in the world (``WorldCall``) and what records a create (``RecordCreate``)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import re
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from falcon_es.domain.clusters import region_of
from falcon_es.adapters.sim.config import (
    ClusterBehaviour, JobDefaults, ReservationConfig, SimClusterConfig,
)

T = TypeVar("T")

#: A GKE node pool name (the API's own regex; 40 characters at most).
POOL_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?$")
#: An RFC 1123 label, as Kubernetes requires of a Job name (63 characters at most).
DNS_LABEL = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(?:(?:[A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
#: What cluster-toolkit's gke-node-pool module says of COMPACT placement over several
#: zones (GKE's own API wording for the refusal is not published; docs/FIDELITY.md).
COMPACT_ZONES_WORDS = ("Compact placement is only available for node pools operating in a "
                       "single zone.")
#: Characters Kubernetes uses for generated name suffixes (no vowels, no look-alikes).
#: The status words of the simulated GKE operations: RUNNING until DONE (GKE's enum
#: also has PENDING and ABORTING, which the sim never answers).
OPERATION_RUNNING, OPERATION_DONE = "RUNNING", "DONE"
SUFFIX_CHARS = "bcdfghjklmnpqrstvwxz2456789"


@dataclasses.dataclass(frozen=True)
class ClusterIdentity:
    """The cluster as GKE knows it: its own ``location`` (a zone or a region) and its
    ``zones`` (``Cluster.locations``); ``node_zone`` is where its reservations live
    unless one names its own zone."""

    name: str
    project: str
    location: str
    tpu_types: tuple[str, ...]
    config: SimClusterConfig
    behaviour: ClusterBehaviour
    jobs: JobDefaults
    zones: tuple[str, ...] = ()
    node_zone: str = ""

    @property
    def path(self) -> str:
        return f"projects/{self.project}/locations/{self.location}/clusters/{self.name}"

    def pool_path(self, pool: str) -> str:
        return f"{self.path}/nodePools/{pool}"

    def reservation_zone(self, reservation: ReservationConfig) -> str:
        return reservation.zone or self.node_zone or self.location

    def reservation_path(self, reservation: str, zone: str) -> str:
        return f"projects/{self.project}/zones/{zone}/reservations/{reservation}"


class WorldCall(Protocol):
    """Runs one API call at the world's current moment, once the world has played
    what became due, and publishes what the call changed (``SimWorld.call``).

    The port adapters get this and a lookup of the cluster's side they serve instead
    of the whole world: the world builds them, so they must not need to know it.
    """

    def __call__(self, action: Callable[[dt.datetime], T], /) -> T: ...


#: Tells the world a create call succeeded: (cluster, kind, name); the world keeps the
#: record, so a test can show that nothing was created twice across restarts.
RecordCreate = Callable[[str, str, str], None]


def no_record(cluster: str, kind: str, name: str) -> None:
    """A port adapter built without a world to tell."""


def random_streams(seed: int, cluster: str) -> dict[str, random.Random]:
    """Independent streams per cluster and concern: adding a cluster, or turning on
    delivery faults, leaves every other stream's draws unchanged."""
    return {name: random.Random(f"{seed}:{cluster}:{name}")
            for name in ("gke", "kube", "delivery")}


def suffix(rng: random.Random, length: int = 5) -> str:
    return "".join(rng.choice(SUFFIX_CHARS) for _ in range(length))


def label_problem(labels: object) -> str | None:
    """Why these labels would be refused by Kubernetes, or None when they are valid."""
    if not isinstance(labels, Mapping):
        return f"expected a map of strings, found {type(labels).__name__}"
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            return f"label {key!r}: keys and values must be strings"
        prefix, _, name = key.rpartition("/")
        if not _LABEL_NAME.match(name) or (prefix and not _LABEL_PREFIX.match(prefix)):
            return (f'Invalid value: "{key}": name part must consist of alphanumeric characters, '
                    "'-', '_' or '.', and must start and end with an alphanumeric character")
        if not _LABEL_VALUE.match(value):
            return (f'Invalid value: "{value}": a valid label must be an empty string or consist '
                    "of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                    "alphanumeric character (at most 63 characters)")
    return None


def seconds_after(moment: dt.datetime, seconds: float) -> dt.datetime:
    return moment + dt.timedelta(seconds=seconds)


def zone_problem(location: str, zones: tuple[str, ...], multi_host: bool) -> str | None:
    """Why GKE refuses a pool in ``zones`` of the cluster at ``location``, or None: its
    zones lie in the cluster's region, and a multi-host slice (COMPACT placement, or
    Ironwood's workload policy, one ICI domain either way) wants a single zone."""
    region = region_of(location)
    outside = [zone for zone in zones if region_of(zone) != region]
    if outside:
        return f"Node pool locations {', '.join(outside)} are not in the cluster's region {region}."
    if len(zones) > 1 and multi_host:
        return COMPACT_ZONES_WORDS
    return None
