"""The cluster registry: rows in ``clusters``, each change also a fact in the log."""

from __future__ import annotations

import dataclasses
import uuid

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from falcon_es.domain import events as ev
from falcon_es.storage.store import EventStore, Meta, StreamAppend
from falcon_es.storage.tables import clusters
from falcon_es.domain.clusters import (
    CLUSTER_NAME, CLUSTER_STATUSES, Cluster, RegistryError, node_location_for,
)


def list_clusters(conn: Connection) -> list[Cluster]:
    rows = conn.execute(sa.select(clusters).order_by(clusters.c.name))
    return [Cluster(**row._mapping) for row in rows]


def find_cluster(conn: Connection, name: str) -> Cluster | None:
    row = conn.execute(sa.select(clusters).where(clusters.c.name == name)).first()
    return Cluster(**row._mapping) if row else None


def add_cluster(
    store: EventStore, *, name: str, project: str, location: str, tpu_type: str,
    gcs_bucket: str, default_reservation: str | None = None, status: str = "active",
    actor: str = "operator", node_location: str | None = None,
) -> Cluster:
    from falcon_es.domain.tpu import TPU_TYPES

    if not CLUSTER_NAME.match(name):
        raise RegistryError(
            f"cluster name {name!r}: use lowercase letters, digits and '-' (GKE rules)"
        )
    _check_status(status)
    if tpu_type not in TPU_TYPES:
        raise RegistryError(
            f"TPU type {tpu_type!r} is unknown; known: {', '.join(sorted(TPU_TYPES))}"
        )
    node_location = node_location_for(name, location, node_location)
    with store.engine.connect() as conn:
        if find_cluster(conn, name):
            raise RegistryError(f"cluster {name!r} is already registered")
    # The id names the GKE cluster itself (project, location, name): the same cluster
    # gets the same id in every database, so what is derived from it (a queue's
    # refresh slice, the order queues are swept in) is the same on every run.
    cluster_id = str(uuid.uuid5(uuid.NAMESPACE_URL,
                                f"https://container.googleapis.com/v1/projects/{project}"
                                f"/locations/{location}/clusters/{name}"))
    cluster = Cluster(
        cluster_id, name, project, location, tpu_type, gcs_bucket,
        default_reservation, status, store.clock.now(), node_location,
    )
    event = ev.ClusterRegistered(
        cluster.id, name, project, location, tpu_type, gcs_bucket, default_reservation, status,
        node_location,
    )
    store.append(
        [StreamAppend(cluster.stream_id, 0, (event,), Meta(actor=actor))],
        extra=[lambda c: c.execute(clusters.insert().values(**dataclasses.asdict(cluster)))],
    )
    return cluster


def set_status(store: EventStore, name: str, status: str, actor: str = "operator") -> Cluster:
    _check_status(status)
    cluster = _registered(store, name)
    if cluster.status == status:
        return cluster
    _record(store, cluster, ev.ClusterStatusChanged(cluster.id, name, cluster.status, status),
            actor, status=status)
    return dataclasses.replace(cluster, status=status)


def set_node_location(store: EventStore, name: str, zone: str,
                      actor: str = "operator") -> Cluster:
    """Give a registered cluster the zone its TPU pools go in (the way a regional
    cluster registered before the zone was kept becomes usable). Pools that exist stay
    where they are; new pools and reservation reads use the new zone."""
    cluster = _registered(store, name)
    zone = node_location_for(name, cluster.location, zone)
    if cluster.node_location == zone:
        return cluster
    _record(store, cluster, ev.ClusterNodeLocationSet(cluster.id, name, cluster.node_location,
                                                      zone), actor, node_location=zone)
    return dataclasses.replace(cluster, node_location=zone)


def _registered(store: EventStore, name: str) -> Cluster:
    with store.engine.connect() as conn:
        cluster = find_cluster(conn, name)
    if cluster is None:
        raise RegistryError(f"cluster {name!r} is not registered")
    return cluster


def _record(store: EventStore, cluster: Cluster, event: ev.Event, actor: str,
            **values: str) -> None:
    """The change as a fact on the cluster's stream and, in the same commit, its row."""
    store.append(
        [StreamAppend(cluster.stream_id, None, (event,), Meta(actor=actor))],
        extra=[lambda c: c.execute(
            clusters.update().where(clusters.c.id == cluster.id).values(**values)
        )],
    )


def _check_status(status: str) -> None:
    if status not in CLUSTER_STATUSES:
        raise RegistryError(
            f"cluster status {status!r}: expected one of {', '.join(CLUSTER_STATUSES)}"
        )
