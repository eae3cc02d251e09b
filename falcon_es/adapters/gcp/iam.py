"""The edge projects' custom role, and asking Cloud Resource Manager which of its
permissions an identity holds.

``EDGE_PERMISSIONS`` is the one list of what the controller's identity needs in each
edge project: ``deploy/iam/setup.sh`` grants exactly these (the deploy test holds the
script's list equal to this one) and ``falcon-es doctor`` tests them with
``projects.testIamPermissions`` (Resource Manager v1 REST: POST
``/v1/projects/{project}:testIamPermissions`` with ``{"permissions": [...]}``, answered
with the subset the caller holds; the call itself needs no permission). Google
documents that method for permission-aware tools, not as an authorization check, so a
missing permission it names is the likely cause of a refusal, and every call still
reports its own denial.
"""

from __future__ import annotations

from collections.abc import Sequence

import requests
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials, Credentials
from google.auth.transport.requests import AuthorizedSession, Request

from falcon_es.adapters.gcp.wiring import is_local

#: The custom role ``deploy/iam/setup.sh`` creates in each edge project.
EDGE_ROLE_ID = "falconEdgeOperator"
RESOURCE_MANAGER_ENDPOINT = "https://cloudresourcemanager.googleapis.com"
#: The narrowest set that authorizes every call Falcon-ES makes in an edge project.
EDGE_PERMISSIONS = (
    # Node pools, by Google's "GKE API permissions" page: create and delete are
    # authorized by container.clusters.update, get and list (and the cluster's endpoint
    # and CA) by container.clusters.get; no container.nodePools.* permission exists.
    "container.clusters.update",
    "container.clusters.get",
    # following a node-pool operation (operations are never listed)
    "container.operations.get",
    # remaining reservation capacity
    "compute.reservations.get",
    "compute.reservations.list",
    # Ironwood (v7x) multi-host slices: their workload policy and its regional operation
    "compute.resourcePolicies.get",
    "compute.resourcePolicies.create",
    "compute.regionOperations.get",
    # the edge cluster's Kubernetes API: Jobs, the headless Service of a multi-host Job,
    # and Pods, Nodes and Events for status and root causes
    "container.jobs.create",
    "container.jobs.get",
    "container.jobs.list",
    "container.jobs.watch",
    "container.jobs.delete",
    "container.services.create",
    "container.services.get",
    "container.services.delete",
    # a multi-slice task's JobSet, a custom resource (GKE authorizes custom resources
    # by container.thirdPartyObjects.*): create, adopt, delete, list (doctor's CRD
    # check, the informer) and watch (the informer)
    "container.thirdPartyObjects.create",
    "container.thirdPartyObjects.get",
    "container.thirdPartyObjects.list",
    "container.thirdPartyObjects.watch",
    "container.thirdPartyObjects.delete",
    "container.pods.get",
    "container.pods.list",
    "container.pods.watch",
    "container.nodes.get",
    "container.nodes.list",
    "container.events.list",
    # the informer follows the Job controller's FailedCreate events
    "container.events.watch",
)


def resource_manager_session(credentials: Credentials, endpoint: str | None, *,
                             auth_request: Request | None = None) -> AuthorizedSession:
    """An HTTP session for Resource Manager: Google's endpoint with the credentials, or a
    local ``http://`` one (a fake) anonymously."""
    if is_local(endpoint):
        credentials = AnonymousCredentials()
    return AuthorizedSession(credentials, auth_request=auth_request)


def granted_permissions(session: requests.Session, project: str, permissions: Sequence[str],
                        *, endpoint: str | None = None, timeout: float = 15.0) -> set[str]:
    """Which of ``permissions`` the session's identity holds on ``project``.

    Raises the ``google.api_core`` exception of the HTTP error (403 when the project
    is not visible to the identity, 400 for a permission name the API rejects)."""
    url = (f"{(endpoint or RESOURCE_MANAGER_ENDPOINT).rstrip('/')}/v1/projects/"
           f"{project}:testIamPermissions")
    response = session.post(url, json={"permissions": list(permissions)}, timeout=timeout)
    if response.status_code != 200:
        raise gexc.from_http_response(response)
    return set(response.json().get("permissions", []))
