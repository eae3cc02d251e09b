#!/usr/bin/env bash
# IAM, Workload Identity and Pub/Sub for Falcon-ES. Idempotent: safe to run again.
#
#   CENTRAL_PROJECT=my-central-project \
#   EDGE_PROJECTS="edge-project-a edge-project-b" \
#   LOG_BUCKET=my-falcon-logs \
#   bash deploy/iam/setup.sh
#
# DRY_RUN=1 prints every command instead of running it (nothing is called).
#
# What it sets up:
#   central project: the Google service account falcon-controller, the Workload
#     Identity binding for Kubernetes service account falcon/falcon-controller, the
#     Pub/Sub topics falcon-edge-events and falcon-task-events with their
#     subscriptions, and publish / subscribe rights on exactly those.
#   each edge project: a custom role with only the permissions Falcon-ES uses (node
#     pools, operations, cluster get, reservations, and the Kubernetes objects it
#     touches), granted to the central account, instead of roles/container.admin;
#     actAs on the edge node pools' service account; log-bucket access for the Jobs'
#     Kubernetes service account falcon-jobs/falcon-task.
set -euo pipefail

CENTRAL_PROJECT="${CENTRAL_PROJECT:?set CENTRAL_PROJECT to the project of the central GKE cluster}"
EDGE_PROJECTS="${EDGE_PROJECTS:?set EDGE_PROJECTS to the space-separated projects of the edge clusters}"
LOG_BUCKET="${LOG_BUCKET:-}"                       # gs://LOG_BUCKET/logs/<job_id>/...
GSA_NAME="${GSA_NAME:-falcon-controller}"
K8S_NAMESPACE="${K8S_NAMESPACE:-falcon}"
K8S_SERVICE_ACCOUNT="${K8S_SERVICE_ACCOUNT:-falcon-controller}"
JOB_NAMESPACE="${JOB_NAMESPACE:-falcon-jobs}"
JOB_SERVICE_ACCOUNT="${JOB_SERVICE_ACCOUNT:-falcon-task}"
# The service account the edge TPU node pools run as (default: the Compute Engine
# default service account of each edge project, PROJECT_NUMBER-compute@...).
EDGE_NODE_SERVICE_ACCOUNT="${EDGE_NODE_SERVICE_ACCOUNT:-}"
EDGE_ROLE_ID="${EDGE_ROLE_ID:-falconEdgeOperator}"
EDGE_TOPIC="${EDGE_TOPIC:-falcon-edge-events}"
TASK_TOPIC="${TASK_TOPIC:-falcon-task-events}"
EDGE_SUBSCRIPTION="${EDGE_SUBSCRIPTION:-falcon-edge-events-controller}"
OPS_SUBSCRIPTION="${OPS_SUBSCRIPTION:-falcon-task-events-ops}"

GSA_EMAIL="${GSA_NAME}@${CENTRAL_PROJECT}.iam.gserviceaccount.com"
GSA_MEMBER="serviceAccount:${GSA_EMAIL}"
WI_MEMBER="serviceAccount:${CENTRAL_PROJECT}.svc.id.goog[${K8S_NAMESPACE}/${K8S_SERVICE_ACCOUNT}]"

# The narrowest set that works, by what uses it. The same list is EDGE_PERMISSIONS in
# falcon_es/adapters/gcp/iam.py, which `falcon-es doctor` tests on each edge project
# (tests/test_deploy.py holds the two equal):
EDGE_PERMISSIONS=(
  # Node pools, by Google's "GKE API permissions" page: nodePools.create and .delete
  # are authorized by container.clusters.update on the cluster, nodePools.get and .list
  # (reuse, the orphan sweep) by container.clusters.get, which also gives the edge
  # cluster's endpoint and CA to the Kubernetes client. There is no
  # container.nodePools.* permission: gcloud refuses a role that names one.
  container.clusters.update
  container.clusters.get
  # follow a node-pool operation to DONE and read its error (operations are never listed)
  container.operations.get
  # remaining reservation capacity (count - inUseCount)
  compute.reservations.get
  compute.reservations.list
  # Ironwood (v7x) multi-host slices: read or create their workload placement policy
  # and follow the regional operation that creates it
  compute.resourcePolicies.get
  compute.resourcePolicies.create
  compute.regionOperations.get
  # Kubernetes API of the edge cluster: submit / watch / delete Jobs, read Pods,
  # Nodes and Events for status and root-cause diagnostics
  container.jobs.create
  container.jobs.get
  container.jobs.list
  container.jobs.watch
  container.jobs.delete
  # the headless Service of a multi-host Job (its workers find each other through it):
  # create it, read one that exists already, replace one left by an earlier Job
  container.services.create
  container.services.get
  container.services.delete
  # a multi-slice task's JobSet (a custom resource: GKE authorizes custom resources by
  # container.thirdPartyObjects.*): create it, read one that exists (adoption), delete
  # it with its child Jobs, list and watch JobSets (the informer; doctor's check that
  # the CRD is installed)
  container.thirdPartyObjects.create
  container.thirdPartyObjects.get
  container.thirdPartyObjects.list
  container.thirdPartyObjects.watch
  container.thirdPartyObjects.delete
  container.pods.get
  container.pods.list
  container.pods.watch
  container.nodes.get
  container.nodes.list
  container.events.list
  container.events.watch
)

run() {
  if [[ "${DRY_RUN:-0}" == "1" ]]; then
    printf '%q ' "$@"
    printf '\n'
  else
    "$@"
  fi
}

exists() {
  # In a dry run nothing exists yet: print the create commands.
  [[ "${DRY_RUN:-0}" == "1" ]] && return 1
  "$@" >/dev/null 2>&1
}

join_by_comma() {
  local IFS=,
  printf '%s' "$*"
}

echo "== central project ${CENTRAL_PROJECT}"
run gcloud services enable iam.googleapis.com container.googleapis.com pubsub.googleapis.com \
  --project "${CENTRAL_PROJECT}"

if ! exists gcloud iam service-accounts describe "${GSA_EMAIL}" --project "${CENTRAL_PROJECT}"; then
  run gcloud iam service-accounts create "${GSA_NAME}" --project "${CENTRAL_PROJECT}" \
    --display-name "Falcon-ES controller" \
    --description "Runs the Falcon-ES controller and informers (Workload Identity; no keys)"
fi

# Workload Identity: pods running as falcon/falcon-controller act as the GSA. No key
# file is ever created.
run gcloud iam service-accounts add-iam-policy-binding "${GSA_EMAIL}" \
  --project "${CENTRAL_PROJECT}" \
  --role roles/iam.workloadIdentityUser \
  --member "${WI_MEMBER}"

for topic in "${EDGE_TOPIC}" "${TASK_TOPIC}"; do
  if ! exists gcloud pubsub topics describe "${topic}" --project "${CENTRAL_PROJECT}"; then
    run gcloud pubsub topics create "${topic}" --project "${CENTRAL_PROJECT}"
  fi
  # Informers publish edge events, the controller publishes the task-event stream;
  # viewer lets `falcon-es doctor` check that the topic exists.
  run gcloud pubsub topics add-iam-policy-binding "${topic}" --project "${CENTRAL_PROJECT}" \
    --role roles/pubsub.publisher --member "${GSA_MEMBER}"
  run gcloud pubsub topics add-iam-policy-binding "${topic}" --project "${CENTRAL_PROJECT}" \
    --role roles/pubsub.viewer --member "${GSA_MEMBER}"
done

if ! exists gcloud pubsub subscriptions describe "${EDGE_SUBSCRIPTION}" --project "${CENTRAL_PROJECT}"; then
  # The controller acks only after the resulting events are committed.
  run gcloud pubsub subscriptions create "${EDGE_SUBSCRIPTION}" --project "${CENTRAL_PROJECT}" \
    --topic "${EDGE_TOPIC}" --ack-deadline 60 --message-retention-duration 7d \
    --min-retry-delay 1s --max-retry-delay 60s
fi
run gcloud pubsub subscriptions add-iam-policy-binding "${EDGE_SUBSCRIPTION}" \
  --project "${CENTRAL_PROJECT}" --role roles/pubsub.subscriber --member "${GSA_MEMBER}"

if ! exists gcloud pubsub subscriptions describe "${OPS_SUBSCRIPTION}" --project "${CENTRAL_PROJECT}"; then
  # For ops consumers of the task-event stream: ordered per task (ordering key =
  # stream id). Grant roles/pubsub.subscriber on it to whoever consumes it.
  run gcloud pubsub subscriptions create "${OPS_SUBSCRIPTION}" --project "${CENTRAL_PROJECT}" \
    --topic "${TASK_TOPIC}" --enable-message-ordering --ack-deadline 60 \
    --message-retention-duration 7d
fi

for edge in ${EDGE_PROJECTS}; do
  echo "== edge project ${edge}"
  run gcloud services enable container.googleapis.com compute.googleapis.com --project "${edge}"

  permissions="$(join_by_comma "${EDGE_PERMISSIONS[@]}")"
  if exists gcloud iam roles describe "${EDGE_ROLE_ID}" --project "${edge}"; then
    run gcloud iam roles update "${EDGE_ROLE_ID}" --project "${edge}" \
      --permissions "${permissions}" --quiet
  else
    run gcloud iam roles create "${EDGE_ROLE_ID}" --project "${edge}" \
      --title "Falcon-ES edge operator" \
      --description "Node pools, operations, reservations and Jobs for Falcon-ES; nothing else" \
      --permissions "${permissions}" --stage GA
  fi
  run gcloud projects add-iam-policy-binding "${edge}" \
    --role "projects/${edge}/roles/${EDGE_ROLE_ID}" --member "${GSA_MEMBER}" \
    --condition None

  # Creating a node pool that runs as a service account needs actAs on that account
  # (only that one, not project-wide).
  node_sa="${EDGE_NODE_SERVICE_ACCOUNT}"
  if [[ -z "${node_sa}" ]]; then
    if [[ "${DRY_RUN:-0}" == "1" ]]; then
      node_sa="EDGE_PROJECT_NUMBER-compute@developer.gserviceaccount.com"
    else
      number="$(gcloud projects describe "${edge}" --format 'value(projectNumber)')"
      node_sa="${number}-compute@developer.gserviceaccount.com"
    fi
  fi
  run gcloud iam service-accounts add-iam-policy-binding "${node_sa}" --project "${edge}" \
    --role roles/iam.serviceAccountUser --member "${GSA_MEMBER}"

  # The Jobs' pods write stdout/stderr to gs://LOG_BUCKET/logs/<job_id>/ through the
  # GCS FUSE CSI driver as Kubernetes service account falcon-jobs/falcon-task.
  if [[ -n "${LOG_BUCKET}" ]]; then
    if [[ "${DRY_RUN:-0}" == "1" ]]; then
      number="EDGE_PROJECT_NUMBER"
    else
      number="$(gcloud projects describe "${edge}" --format 'value(projectNumber)')"
    fi
    run gcloud storage buckets add-iam-policy-binding "gs://${LOG_BUCKET}" \
      --role roles/storage.objectUser \
      --member "principal://iam.googleapis.com/projects/${number}/locations/global/workloadIdentityPools/${edge}.svc.id.goog/subject/ns/${JOB_NAMESPACE}/sa/${JOB_SERVICE_ACCOUNT}"
  fi
done

echo "== done. In each edge cluster create the Jobs' namespace and service account:"
echo "   kubectl create namespace ${JOB_NAMESPACE}"
echo "   kubectl -n ${JOB_NAMESPACE} create serviceaccount ${JOB_SERVICE_ACCOUNT}"
