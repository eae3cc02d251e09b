"""``falcon-es doctor``: is this installation able to run against real GCP?

One ``Check`` per thing that must work, each a line with what was found, and for a
failure the root cause in the API's own words and the fix. Checks that depend on one
that failed are reported as skipped, naming it, so the first failure is the one to
fix. The identity is the one the controller uses: Application Default
Credentials; the token itself is never shown.

Per registered cluster: GKE ``get_cluster`` (the endpoint and CA come from there), which
kind it is (regional or zonal) and whether the zone its TPU pools go in lies in its
region and among GKE's ``locations`` for it, the Workload Identity pool and the GCS FUSE
CSI add-on (Jobs write their logs through it), whether node upgrades can recreate
running TPU slices (``upgrades.py``),
the Kubernetes API (``/version``, then listing Jobs in the Jobs' namespace with the
Google token), listing node pools, and the cluster's reservation. Per edge project, the
edge role's permissions (Resource Manager ``testIamPermissions``), each missing one by
name. Then the Pub/Sub topics and the controller's edge-events subscription.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import Any

import google.auth.transport.requests
import google.cloud.pubsub_v1 as pubsub_v1  # untyped (no py.typed): mypy skips this form
import requests
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exceptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import compute_v1, container_v1

from falcon_es.adapters.gcp.compute import reservation_ref
from falcon_es.adapters.gcp.errors import api_words
from falcon_es.adapters.gcp.gke import GkeNodePools, cluster_path
from falcon_es.adapters.gcp.iam import (
    EDGE_PERMISSIONS,
    EDGE_ROLE_ID,
    granted_permissions,
    resource_manager_session,
)
from falcon_es.adapters.gcp.kube import KubeEdgeClusters
from falcon_es.adapters.gcp.kube_auth import GkeEndpoints, GoogleAccessTokens
from falcon_es.adapters.gcp.upgrades import upgrade_exposure
from falcon_es.adapters.gcp.wiring import (
    ADC_HINT,
    CredentialsSource,
    GcpConfigError,
    application_default_credentials,
    build_cluster_manager,
    is_local,
    pubsub_project,
)
from falcon_es.domain.ports import PERMISSION_DENIED, PortError
from falcon_es.domain.clusters import Cluster, region_of
from falcon_es.config.settings import Settings

OK, FAIL, SKIP = "ok", "fail", "skip"
MARKS = MappingProxyType({OK: "ok  ", FAIL: "FAIL", SKIP: "skip"})
CALL_TIMEOUT_SECONDS = 15.0
SETUP = "deploy/iam/setup.sh"
EDGE_ROLE = f"the {EDGE_ROLE_ID} custom role"
#: How to install the JobSet CRD and controller (its release manifests; pick the
#: release the cluster's Kubernetes version supports).
JOBSET_INSTALL = ("kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/"
                  "releases/download/VERSION/manifests.yaml (a JobSet release, e.g. v0.10.1; "
                  "the controller runs in namespace jobset-system)")


@dataclasses.dataclass(frozen=True)
class Check:
    subject: str  # "credentials", "cluster edge-a", "pubsub", "database"
    name: str
    status: str  # ok | fail | skip
    detail: str
    fix: str = ""

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def line(self) -> str:
        text = f"{MARKS[self.status]} {self.subject}: {self.name}: {self.detail}"
        if self.status == FAIL and self.fix:
            text += f" -- fix: {self.fix}"
        return text

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def identity_of(credentials: Credentials) -> str:
    """Who the credentials act as, in words (never the token)."""
    kind = f"{type(credentials).__module__}.{type(credentials).__name__}"
    email = getattr(credentials, "service_account_email", None)
    if kind.startswith("google.auth.compute_engine"):
        who = f"service account {email}" if email and email != "default" else "the node's account"
        return f"{who} from the metadata server (Workload Identity on GKE) [{kind}]"
    if kind.startswith("google.oauth2.service_account"):
        return (f"service account {email} from a key file (GOOGLE_APPLICATION_CREDENTIALS; "
                f"in the cluster prefer Workload Identity) [{kind}]")
    if kind.startswith("google.oauth2.credentials"):
        account = getattr(credentials, "account", "") or "a user"
        return f"{account} (gcloud auth application-default login) [{kind}]"
    if email:
        return f"service account {email} [{kind}]"
    return f"[{kind}]"


class Doctor:
    """Runs the GCP checks for a list of registered clusters."""

    def __init__(self, settings: Settings, *,
                 credentials_source: CredentialsSource = application_default_credentials,
                 auth_request: Any = None,
                 publisher: Callable[[], Any] = pubsub_v1.PublisherClient,
                 subscriber: Callable[[], Any] = pubsub_v1.SubscriberClient,
                 now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
                 ) -> None:
        self.settings = settings
        self._now = now
        self._credentials_source = credentials_source
        self._auth_request = auth_request
        self._publisher = publisher
        self._subscriber = subscriber
        self.identity = "the controller's identity"

    def run(self, clusters: Sequence[Cluster]) -> list[Check]:
        found = self._credentials()
        checks = [found[0]]
        credentials, project = found[1], found[2]
        if credentials is None:
            needs = "needs Google credentials"
            checks += [Check(f"cluster {c.name}", "all checks", SKIP, needs) for c in clusters]
            checks.append(Check("pubsub", "topics and subscription", SKIP, needs))
            return checks
        cluster_manager = build_cluster_manager(self.settings, credentials)
        edges = KubeEdgeClusters(GkeEndpoints(cluster_manager),
                                 tokens=GoogleAccessTokens(credentials,
                                                           auth_request=self._auth_request),
                                 namespace=self.settings.lifecycle.job_namespace,
                                 request_timeout_seconds=CALL_TIMEOUT_SECONDS)
        endpoint = self.settings.gcp.compute_endpoint
        reservations = compute_v1.ReservationsClient(
            credentials=AnonymousCredentials() if is_local(endpoint) else credentials,
            client_options={"api_endpoint": endpoint} if endpoint else None)
        try:
            for cluster in clusters:
                checks += self._cluster(cluster, cluster_manager, edges, reservations)
            checks += self._edge_roles(credentials, clusters)
            checks += self._pubsub(project)
        finally:
            edges.close()
            reservations.transport.close()
            cluster_manager.transport.close()
        return checks

    # ------------------------------------------------------------ credentials

    def _credentials(self) -> tuple[Check, Credentials | None, str | None]:
        name = "Application Default Credentials"
        try:
            credentials, project = self._credentials_source()
        except GcpConfigError as error:
            return Check("credentials", name, FAIL, str(error).split("; ")[0], ADC_HINT), None, None
        try:
            credentials.refresh(self._auth_request or google.auth.transport.requests.Request())
        except (auth_exceptions.RefreshError, auth_exceptions.TransportError) as error:
            self.identity = identity_of(credentials)
            return Check("credentials", name, FAIL,
                         f"{self.identity} found, but no token could be obtained: {error}",
                         "on GKE check the Workload Identity binding (roles/iam."
                         "workloadIdentityUser for the pod's Kubernetes service account, "
                         f"{SETUP}) and that the node pool runs the GKE metadata server; "
                         "elsewhere run `gcloud auth application-default login`"), None, None
        self.identity = identity_of(credentials)
        where = f"; project {project}" if project else ""
        return Check("credentials", name, OK, f"{self.identity}{where}; a token was "
                                              "obtained"), credentials, project

    # ------------------------------------------------------------ one cluster

    def _cluster(self, cluster: Cluster, cluster_manager: container_v1.ClusterManagerClient,
                 edges: KubeEdgeClusters, reservations: compute_v1.ReservationsClient,
                 ) -> list[Check]:
        subject = f"cluster {cluster.name}"
        grant = (f"grant {self.identity_email()} {EDGE_ROLE} in project {cluster.project} "
                 f"({SETUP})")
        path = cluster_path(cluster)
        checks: list[Check] = []
        try:
            gke = cluster_manager.get_cluster(name=path, timeout=CALL_TIMEOUT_SECONDS,
                                              retry=None)
        except (gexc.GoogleAPIError, requests.RequestException) as error:
            fix = grant
            if isinstance(error, gexc.NotFound):
                fix = (f"no GKE cluster {cluster.name} in project {cluster.project} location "
                       f"{cluster.location}: correct the registration (falcon-es cluster add "
                       "takes --project and --location: a regional cluster's region, with "
                       "--node-location ZONE) or create the cluster")
            elif not isinstance(error, (gexc.PermissionDenied, gexc.Forbidden,
                                        gexc.Unauthenticated)):
                fix = "check that the GKE API is enabled and reachable from here"
            checks.append(Check(subject, "GKE get_cluster", FAIL, _words(error), fix))
            checks.append(_location(subject, cluster, None))
            needs = "needs GKE get_cluster (endpoint and CA)"
            checks += [Check(subject, name, SKIP, needs)
                       for name in ("Workload Identity", "GCS FUSE CSI driver", "Kubernetes API")]
        else:
            status = container_v1.Cluster.Status(gke.status).name
            checks.append(Check(subject, "GKE get_cluster", OK,
                                f"{status}, version {gke.current_master_version or 'unknown'}, "
                                f"endpoint {gke.endpoint or 'none'}"))
            checks.append(_location(subject, cluster, list(gke.locations)))
            checks += self._cluster_features(subject, cluster, gke)
            checks.append(self._upgrades(subject, cluster, gke, cluster_manager))
            kubernetes = self._kubernetes(subject, cluster, edges)
            checks.append(kubernetes)
            checks.append(self._jobset_crd(subject, cluster, edges) if not kubernetes.failed
                          else Check(subject, "JobSet CRD", SKIP, "needs the Kubernetes API"))
        checks.append(self._node_pools(subject, cluster, cluster_manager, grant))
        checks.append(self._reservation(subject, cluster, reservations))
        return checks

    def _cluster_features(self, subject: str, cluster: Cluster,
                          gke: container_v1.Cluster) -> list[Check]:
        update = (f"gcloud container clusters update {cluster.name} --project "
                  f"{cluster.project} --location {cluster.location}")
        pool = gke.workload_identity_config.workload_pool
        identity = (Check(subject, "Workload Identity", OK, f"workload pool {pool}") if pool else
                    Check(subject, "Workload Identity", FAIL,
                          "no workload pool: pods cannot act as Google service accounts, so "
                          "Jobs cannot write their logs to the bucket",
                          f"{update} --workload-pool={cluster.project}.svc.id.goog"))
        enabled = gke.addons_config.gcs_fuse_csi_driver_config.enabled
        fuse = (Check(subject, "GCS FUSE CSI driver", OK, "add-on enabled") if enabled else
                Check(subject, "GCS FUSE CSI driver", FAIL,
                      "add-on disabled: Job pods mount their log bucket through it and would "
                      "stay in ContainerCreating",
                      f"{update} --update-addons GcsFuseCsiDriver=ENABLED"))
        return [identity, fuse]

    def _upgrades(self, subject: str, cluster: Cluster, gke: container_v1.Cluster,
                  cluster_manager: container_v1.ClusterManagerClient) -> Check:
        """Whether node upgrades can recreate a running slice (``upgrades.py``)."""
        name = "TPU pool upgrades"
        try:
            listed = cluster_manager.list_node_pools(parent=cluster_path(cluster),
                                                     timeout=CALL_TIMEOUT_SECONDS, retry=None)
        except (gexc.GoogleAPIError, requests.RequestException) as error:
            return Check(subject, name, SKIP, f"needs the node pools: {_words(error)}")
        command = (f"gcloud container clusters update {cluster.name} --project "
                   f"{cluster.project} --location {cluster.location}")
        verdict = upgrade_exposure(gke, listed.node_pools, self._now(),
                                   pool_exclusion=self.settings.features.pool_upgrade_exclusion,
                                   command=command)
        return Check(subject, name, FAIL if verdict.exposed else OK, verdict.found, verdict.fix)

    def _kubernetes(self, subject: str, cluster: Cluster, edges: KubeEdgeClusters) -> Check:
        namespace = self.settings.lifecycle.job_namespace
        try:
            edge = edges.for_cluster(cluster)
            version = edge.version()
            edge.batch.list_namespaced_job(namespace, limit=1,
                                           _request_timeout=CALL_TIMEOUT_SECONDS)
        except PortError as error:
            fix = ("the control plane is not reachable from here: check authorized networks "
                   "or the private endpoint")
            if error.code == PERMISSION_DENIED:
                fix = (f"grant {self.identity_email()} {EDGE_ROLE} (container.jobs.*, services, "
                       f"pods, nodes, events) in project {cluster.project} ({SETUP})")
            return Check(subject, "Kubernetes API", FAIL, error.message, fix)
        except Exception as error:  # the kubernetes client raises many kinds
            port = edges.for_cluster(cluster).error(error, f"listing Jobs in {namespace}")
            fix = (f"grant {self.identity_email()} {EDGE_ROLE} in project {cluster.project} "
                   f"({SETUP})" if port.code == PERMISSION_DENIED else
                   "check the API server's answer above")
            return Check(subject, "Kubernetes API", FAIL, port.message, fix)
        return Check(subject, "Kubernetes API", OK,
                     f"{version} at {edge.host}; Jobs in namespace {namespace} can be listed")

    def _jobset_crd(self, subject: str, cluster: Cluster, edges: KubeEdgeClusters) -> Check:
        """Multi-slice tasks run as JobSets: the CRD (and its controller) must be there."""
        try:
            installed = edges.for_cluster(cluster).jobset_crd_installed()
        except PortError as error:
            fix = (f"grant {self.identity_email()} {EDGE_ROLE} (container.thirdPartyObjects.*) "
                   f"in project {cluster.project} ({SETUP})"
                   if error.code == PERMISSION_DENIED else "check the API server's answer")
            return Check(subject, "JobSet CRD", FAIL, error.message, fix)
        if not installed:
            return Check(subject, "JobSet CRD", FAIL,
                         "jobsets.jobset.x-k8s.io is not served: multi-slice tasks (slices > 1) "
                         "cannot be submitted to this cluster", f"install JobSet: {JOBSET_INSTALL}")
        return Check(subject, "JobSet CRD", OK, "jobset.x-k8s.io/v1alpha2 JobSets can be listed")

    def _node_pools(self, subject: str, cluster: Cluster,
                    cluster_manager: container_v1.ClusterManagerClient, grant: str) -> Check:
        try:
            pools = GkeNodePools(cluster_manager, timeout=CALL_TIMEOUT_SECONDS).list(cluster)
        except PortError as error:
            fix = grant if error.code == PERMISSION_DENIED else "check the GKE API's answer"
            return Check(subject, "node pools list", FAIL, error.message, fix)
        ours = sum(1 for p in pools if p.labels.get("managed-by") == "falcon")
        return Check(subject, "node pools list", OK,
                     f"{len(pools)} node pool(s), {ours} managed by Falcon")

    def _reservation(self, subject: str, cluster: Cluster,
                     reservations: compute_v1.ReservationsClient) -> Check:
        name = cluster.default_reservation
        if not name:
            return Check(subject, "reservation", OK, "none named (pools default to flex-start)")
        try:
            ref = reservation_ref(cluster, name)
        except PortError as error:
            return Check(subject, f"reservation {name}", FAIL, error.message,
                         f"falcon-es cluster set-node-location {cluster.name} ZONE")
        try:
            found = reservations.get(project=ref.project, zone=ref.zone, reservation=ref.name,
                                     timeout=CALL_TIMEOUT_SECONDS, retry=None)
        except (gexc.GoogleAPIError, requests.RequestException) as error:
            if isinstance(error, gexc.NotFound):
                return Check(subject, f"reservation {name}", FAIL,
                             f"reservation {ref.name} not found in project {ref.project} zone "
                             f"{ref.zone}",
                             f"check the name (gcloud compute reservations list --project "
                             f"{ref.project}) and register the cluster again with "
                             "--reservation NAME")
            fix = (f"grant {self.identity_email()} compute.reservations.get in project "
                   f"{ref.project} ({SETUP})"
                   if isinstance(error, (gexc.PermissionDenied, gexc.Forbidden))
                   else "check the Compute API's answer")
            return Check(subject, f"reservation {name}", FAIL, _words(error), fix)
        if "specific_reservation" in found:
            specific = found.specific_reservation
            machine = specific.instance_properties.machine_type.rsplit("/", 1)[-1]
            detail = (f"{found.status or 'unknown status'}: "
                      f"{specific.count - specific.in_use_count} of {specific.count} "
                      f"{machine} VM(s) free")
        else:
            held = ", ".join(f"{r.accelerator.accelerator_count} "
                             f"{r.accelerator.accelerator_type.rsplit('/', 1)[-1]}"
                             for r in found.aggregate_reservation.reserved_resources)
            detail = f"{found.status or 'unknown status'}: aggregate, {held or 'nothing'} reserved"
        if found.status and found.status != "READY":
            return Check(subject, f"reservation {name}", FAIL, detail,
                         "wait until the reservation is READY")
        return Check(subject, f"reservation {name}", OK, detail)

    # ------------------------------------------------------------ the edge role

    def _edge_roles(self, credentials: Credentials, clusters: Sequence[Cluster]) -> list[Check]:
        """Per edge project (each registered cluster's, once): which of the edge role's
        permissions the identity lacks there, by Resource Manager's testIamPermissions."""
        projects = list(dict.fromkeys(cluster.project for cluster in clusters))
        if not projects:
            return []
        session = resource_manager_session(credentials, self.settings.gcp.resource_manager_endpoint,
                                           auth_request=self._auth_request)
        try:
            return [self._edge_role(session, project) for project in projects]
        finally:
            session.close()

    def _edge_role(self, session: requests.Session, project: str) -> Check:
        subject, name = f"project {project}", f"{EDGE_ROLE_ID} permissions"
        grant = f"grant {self.identity_email()} {EDGE_ROLE} in project {project} ({SETUP})"
        try:
            granted = granted_permissions(session, project, EDGE_PERMISSIONS,
                                          endpoint=self.settings.gcp.resource_manager_endpoint,
                                          timeout=CALL_TIMEOUT_SECONDS)
        except (gexc.GoogleAPIError, requests.RequestException) as error:
            fix = (f"{grant}; a project the identity cannot see answers 403"
                   if isinstance(error, (gexc.PermissionDenied, gexc.Forbidden)) else
                   "check that the Cloud Resource Manager API is reachable from here")
            return Check(subject, name, FAIL, f"testIamPermissions: {_words(error)}", fix)
        missing = [permission for permission in EDGE_PERMISSIONS if permission not in granted]
        if missing:
            return Check(subject, name, FAIL,
                         f"{self.identity} lacks {len(missing)} of the {len(EDGE_PERMISSIONS)} "
                         f"permissions: {', '.join(missing)}",
                         f"{grant}; if the role exists, run the script again to update it")
        return Check(subject, name, OK, f"all {len(EDGE_PERMISSIONS)} permissions held")

    # ------------------------------------------------------------ Pub/Sub

    def _pubsub(self, adc_project: str | None) -> list[Check]:
        settings = self.settings
        try:
            project = pubsub_project(settings, adc_project)
        except GcpConfigError as error:
            return [Check("pubsub", "project", FAIL, str(error).split(": ")[0],
                          "set FALCON_PUBSUB_PROJECT (or GOOGLE_CLOUD_PROJECT)")]
        publisher, subscriber = self._publisher(), self._subscriber()
        try:
            checks = [self._topic(publisher, project, topic)
                      for topic in (settings.bus.edge_events_topic, settings.bus.task_events_topic)]
            checks.append(self._subscription(subscriber, project))
        finally:
            publisher.transport.close()
            subscriber.close()
        return checks

    def _topic(self, publisher: Any, project: str, topic: str) -> Check:
        path = f"projects/{project}/topics/{topic}"
        try:
            publisher.get_topic(request={"topic": path}, timeout=CALL_TIMEOUT_SECONDS)
        except gexc.GoogleAPIError as error:
            fix = (f"gcloud pubsub topics create {topic} --project {project} ({SETUP})"
                   if isinstance(error, gexc.NotFound) else
                   f"grant {self.identity_email()} roles/pubsub.viewer and "
                   f"roles/pubsub.publisher on {path} ({SETUP})")
            return Check("pubsub", f"topic {topic}", FAIL, _words(error), fix)
        return Check("pubsub", f"topic {topic}", OK, f"{path} exists")

    def _subscription(self, subscriber: Any, project: str) -> Check:
        settings = self.settings
        name, topic = settings.bus.edge_events_subscription, settings.bus.edge_events_topic
        path = f"projects/{project}/subscriptions/{name}"
        topic_path = f"projects/{project}/topics/{topic}"
        try:
            found = subscriber.get_subscription(request={"subscription": path},
                                                timeout=CALL_TIMEOUT_SECONDS)
        except gexc.GoogleAPIError as error:
            fix = (f"gcloud pubsub subscriptions create {name} --project {project} --topic "
                   f"{topic} --ack-deadline 60 ({SETUP})"
                   if isinstance(error, gexc.NotFound) else
                   f"grant {self.identity_email()} roles/pubsub.subscriber on {path} ({SETUP})")
            return Check("pubsub", f"subscription {name}", FAIL, _words(error), fix)
        if found.topic != topic_path:
            return Check("pubsub", f"subscription {name}", FAIL,
                         f"attached to {found.topic}, not {topic_path}: the controller would "
                         "never see the informers' observations",
                         f"delete it and create it on {topic}, or set "
                         "FALCON_EDGE_EVENTS_SUBSCRIPTION / FALCON_EDGE_EVENTS_TOPIC to match")
        return Check("pubsub", f"subscription {name}", OK,
                     f"{path} on {topic}, ack deadline {found.ack_deadline_seconds}s")

    def identity_email(self) -> str:
        words = self.identity.split()
        return words[2] if self.identity.startswith("service account ") else "the identity"


def _location(subject: str, cluster: Cluster, gke_zones: list[str] | None) -> Check:
    """Which kind the cluster is and where its TPU pools go: the node zone must be known,
    lie in the cluster's region and, when GKE answered, be one of its ``locations``
    (a pool in another zone of the region is created, but outside the cluster's zones)."""
    zone = cluster.node_zone
    kind = (f"regional cluster (region {cluster.location})" if cluster.regional
            else f"zonal cluster (zone {cluster.location})")
    if zone is None:
        return Check(subject, "location", FAIL,
                     f"{kind} with no node zone: its TPU pools would spread over every zone "
                     "of the region and its reservation cannot be read",
                     f"falcon-es cluster set-node-location {cluster.name} ZONE")
    if region_of(zone) != region_of(cluster.location):
        return Check(subject, "location", FAIL,
                     f"{kind}: node zone {zone} is not in region {region_of(cluster.location)}",
                     f"falcon-es cluster set-node-location {cluster.name} ZONE")
    if gke_zones is not None and zone not in gke_zones:
        return Check(subject, "location", FAIL,
                     f"{kind}: node zone {zone} is not one of the cluster's zones "
                     f"({', '.join(gke_zones) or 'none'})",
                     f"falcon-es cluster set-node-location {cluster.name} ZONE (one of "
                     "those), or add the zone to the cluster (gcloud container clusters "
                     "update --node-locations)")
    where = "" if gke_zones is not None else " (GKE's zones not checked: needs get_cluster)"
    return Check(subject, "location", OK,
                 f"{kind}; TPU pools and reservations in zone {zone}{where}")


def _words(error: BaseException) -> str:
    if isinstance(error, gexc.GoogleAPIError):
        code = getattr(error, "code", None)
        prefix = f"{int(code)} " if isinstance(code, int) else ""
        return f"{prefix}{type(error).__name__}: {api_words(error)}"
    return f"{type(error).__name__}: {error}"
