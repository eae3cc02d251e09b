"""The ``EdgeCluster`` and ``EdgeClusters`` ports over the simulated Kubernetes API
(``kube_api.KubeService``): each call runs at the world's moment through ``WorldCall``.

Services: a multi-host Job's headless Service is created in the same ``submit_job``
(as the gcp adapter does), so one port call leaves both or neither; an earlier Job's
Service of the same task (its falcon/task-id annotation, ``naming.owned_by``) is
replaced, anybody else's fails the submit.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

from falcon_es.domain.manifests import render_headless_service
from falcon_es.domain.naming import owned_by
from falcon_es.domain.ports import (
    ALREADY_EXISTS, FAILED as PORT_FAILED, JOB_KIND, JOBSET_KIND, JobRef, NodeCounts, PortError,
)
from falcon_es.domain.clusters import Cluster

from falcon_es.adapters.sim.common import RecordCreate, WorldCall, no_record
from falcon_es.adapters.sim.kube_api import KubeService
from falcon_es.adapters.sim.kube_manifests import TASK_ID_ANNOTATION


class SimEdgeCluster:
    """The ``EdgeCluster`` port of one simulated cluster: its Kubernetes API, and
    ``call`` to run each call at the world's moment."""

    def __init__(self, call: WorldCall, kube: KubeService, record: RecordCreate = no_record) -> None:
        self._call = call
        self._kube = kube
        self._record = record

    def submit_job(self, manifest: Mapping[str, Any]) -> JobRef:
        ref = self._call(lambda now: self._submit(manifest, now))
        self._record(self._kube.identity.name, str(manifest.get("kind", JOB_KIND)), ref.name)
        return ref

    def get_job(self, name: str, kind: str = JOB_KIND) -> JobRef | None:
        return self._call(lambda now: self._kube.get_job(name, kind))

    def delete_job(self, name: str, kind: str = JOB_KIND) -> None:
        self._call(lambda now: self._kube.delete_job(name, now, kind))

    def node_counts(self, pool_name: str) -> NodeCounts:
        return self._call(lambda now: self._kube.node_counts(pool_name))

    def diagnose_pending(self, job_name: str) -> str | None:
        return self._call(lambda now: self._kube.diagnose(job_name))

    def _submit(self, manifest: Mapping[str, Any], now: dt.datetime) -> JobRef:
        """The Job, then its headless Service when it is multi-host: one port call, as
        on GKE (see the gcp adapter for adoption after a crash between the two)."""
        kube = self._kube
        ref = kube.submit(manifest, now)
        if manifest.get("kind") == JOBSET_KIND:
            return ref  # the JobSet controller makes its Service itself
        service = render_headless_service(manifest, ref.uid)
        if service is None:
            return ref
        try:
            kube.create_service(service)
        except PortError as error:
            if error.code != ALREADY_EXISTS:
                kube.delete_job(ref.name, now)
                raise
            self._take_over_service(service, ref, now)
        return ref

    def _take_over_service(self, service: Mapping[str, Any], ref: JobRef,
                           now: dt.datetime) -> None:
        """A Service of the task's left by an earlier Job makes room for this Job's;
        anybody else's fails the submit and takes the Job away again."""
        kube = self._kube
        name = service["metadata"]["name"]
        existing = kube.services[name]
        wanted = (service["metadata"].get("annotations") or {}).get(TASK_ID_ANNOTATION)
        if wanted is None or not owned_by(existing.owner, wanted):
            kube.delete_job(ref.name, now)
            known = existing.owner_id or existing.task_label
            belongs = f"task {known}" if known else "no Falcon task"
            raise PortError(PORT_FAILED, f'services "{name}" already exists in namespace '
                                         f"{existing.namespace} on cluster "
                                         f"{kube.identity.name} and belongs to {belongs}; Job "
                                         f"{ref.name} needs that name for its workers to find "
                                         "each other, so it was deleted again")
        kube.delete_service(name)
        kube.create_service(service)


class SimEdgeClusters:
    """The ``EdgeClusters`` port: one simulated Kubernetes API per cluster name.
    ``kube_of(cluster)`` is that cluster's API (created on first use) and ``call`` runs
    a call at the world's moment: all this port needs of the world that builds it."""

    def __init__(self, call: WorldCall, kube_of: Callable[[Cluster], KubeService],
                 record: RecordCreate = no_record) -> None:
        self._call = call
        self._kube_of = kube_of
        self._record = record
        self._edges: dict[str, SimEdgeCluster] = {}

    def for_cluster(self, cluster: Cluster) -> SimEdgeCluster:
        edge = self._edges.get(cluster.name)
        if edge is None:
            edge = self._edges[cluster.name] = SimEdgeCluster(self._call, self._kube_of(cluster),
                                                                self._record)
        return edge
