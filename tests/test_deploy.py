"""deploy/: the kustomizations render and validate against the Kubernetes schemas, the
pods are locked down, the IAM script grants only what is needed, the Grafana dashboard
queries only metrics the process exports, and the Dockerfile's steps work."""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from falcon_es.adapters.gcp.iam import EDGE_PERMISSIONS
from falcon_es.observability import HealthServer, Metrics, PoolSample
from falcon_es.domain.ports import RETRYABLE
from falcon_es.domain.task import TaskState

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUSTOMIZATIONS = sorted(
    str(path.parent.relative_to(ROOT)) for path in DEPLOY.rglob("kustomization.yaml")
)
#: Kubernetes versions GKE offers: the oldest and newest we claim to work with.
K8S_VERSIONS = ("1.30.0", "1.33.0")
CONTROLLER, INFORMER = "controller", "informer"


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl is required to render deploy/ (install it: apt-get install "
                    "kubectl, or the Cloud SDK's kubectl component)", pytrace=False)
    return path


Rendered = dict[str, tuple[dict[str, Any], ...]]


def render(kustomization: str) -> tuple[dict[str, Any], ...]:
    result = subprocess.run([kubectl(), "kustomize", str(ROOT / kustomization)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl kustomize {kustomization}: {result.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


@pytest.fixture(scope="module")
def rendered() -> Rendered:
    """Every kustomization rendered once for the whole module."""
    return {kustomization: render(kustomization) for kustomization in KUSTOMIZATIONS}


def find(objects: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objects
            if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> dict:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def test_every_kustomization_is_found() -> None:
    assert {"deploy/base", "deploy/informer", "deploy/overlays/example"} <= set(KUSTOMIZATIONS)


# --------------------------------------------------------------------------- schemas

#: The part of the monitoring.coreos.com/v1 ServiceMonitor CRD we use (the CRD's own
#: schema is not shipped with kubernetes-validate): unknown fields are refused.
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {"type": "object", "additionalProperties": False,
                             "properties": {"matchLabels": {"type": "object"}}},
                "namespaceSelector": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"any": {"type": "boolean"},
                                   "matchNames": {"type": "array", "items": {"type": "string"}}}},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False,
                    "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string", "pattern": "^/"},
                        "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                        "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                    }}},
            },
        },
    },
}
#: The same for the PodMonitor (its endpoints are ``podMetricsEndpoints``).
POD_MONITOR_SCHEMA: dict[str, Any] = json.loads(
    json.dumps(SERVICE_MONITOR_SCHEMA).replace('"endpoints"', '"podMetricsEndpoints"')
    .replace('"ServiceMonitor"', '"PodMonitor"'))
CRD_SCHEMAS = {("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR_SCHEMA,
               ("monitoring.coreos.com/v1", "PodMonitor"): POD_MONITOR_SCHEMA}


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rendered_objects_validate_against_the_kubernetes_schemas(
    rendered: Rendered, kustomization: str, version: str,
) -> None:
    objects = rendered[kustomization]
    assert objects, f"{kustomization} renders nothing"
    for obj in objects:
        crd_schema = CRD_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
        if crd_schema is not None:
            jsonschema.validate(obj, crd_schema)
            continue
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_validator_refuses_an_unknown_field(rendered: Rendered) -> None:
    deployment = json.loads(json.dumps(one(rendered["deploy/base"], "Deployment")))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)
    monitor = json.loads(json.dumps(one(rendered["deploy/base"], "ServiceMonitor")))
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, SERVICE_MONITOR_SCHEMA)


def test_every_namespaced_object_lives_in_falcon(rendered: Rendered) -> None:
    for kustomization in KUSTOMIZATIONS:
        for obj in rendered[kustomization]:
            if obj["kind"] == "Namespace":
                assert obj["metadata"]["name"] == "falcon"
                continue
            assert obj["metadata"].get("namespace") == "falcon", (
                f"{kustomization}: {obj['kind']} {obj['metadata']['name']} is not in falcon")


# --------------------------------------------------------------------------- security


def deployments(rendered: Rendered) -> Iterator[tuple[str, dict]]:
    for kustomization in KUSTOMIZATIONS:
        for deployment in find(rendered[kustomization], "Deployment"):
            yield kustomization, deployment


def test_every_pod_runs_locked_down(rendered: Rendered) -> None:
    seen = 0
    for kustomization, deployment in deployments(rendered):
        where = f"{kustomization}: {deployment['metadata']['name']}"
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["runAsUser"] >= 1000, where
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        for forbidden in ("hostNetwork", "hostPID", "hostIPC"):
            assert not pod.get(forbidden), f"{where}: {forbidden}"
        assert all("hostPath" not in volume for volume in pod.get("volumes", [])), where
        assert pod["terminationGracePeriodSeconds"] >= 30, where
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True, where
            assert context["readOnlyRootFilesystem"] is True, where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context.get("privileged", False) is False, where
            assert context["capabilities"] == {"drop": ["ALL"]}, where
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert {"cpu", "memory"} <= set(container["resources"]["requests"]), where
            assert "memory" in container["resources"]["limits"], where
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            volumes = {v["name"]: v for v in pod["volumes"]}
            assert "emptyDir" in volumes[mounts["/tmp"]], f"{where}: /tmp must be an emptyDir"
            database = next(e for e in container["env"] if e["name"] == "FALCON_DB_URL")
            assert database["valueFrom"]["secretKeyRef"] == {"name": "falcon-db", "key": "url"}
            assert all("value" not in e or "PASSWORD" not in e["value"].upper()
                       for e in container["env"]), where
            seen += 1
    assert seen >= 4  # the controller and the informer in each of their renderings


def test_the_namespace_enforces_the_restricted_pod_security_standard(rendered: Rendered) -> None:
    namespace = one(rendered["deploy/base"], "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_controller_deployment(rendered: Rendered) -> None:
    objects = rendered["deploy/base"]
    deployment = one(objects, "Deployment", "falcon-controller")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["run"]
    assert pod["serviceAccountName"] == "falcon-controller"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    (port,) = container["ports"]
    settings = one(objects, "ConfigMap")
    assert settings["metadata"]["name"].startswith("falcon-settings-")
    assert container["envFrom"] == [{"configMapRef": {"name": settings["metadata"]["name"]}}]
    assert int(settings["data"]["FALCON_HEALTH_PORT"]) == port["containerPort"] == 8080
    assert settings["data"]["FALCON_LOG_FORMAT"] == "json"
    controller_id = next(e for e in container["env"] if e["name"] == "FALCON_CONTROLLER_ID")
    assert controller_id["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    budget = one(objects, "PodDisruptionBudget")
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]


def test_workload_identity_and_the_lease_role(rendered: Rendered) -> None:
    objects = rendered["deploy/base"]
    account = one(objects, "ServiceAccount", "falcon-controller")
    assert account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"].startswith(
        "falcon-controller@")
    role = one(objects, "Role")
    lease_rules = [r for r in role["rules"] if r["apiGroups"] == ["coordination.k8s.io"]]
    verbs = {verb for rule in lease_rules for verb in rule["verbs"]}
    assert {"create", "get", "update"} <= verbs
    assert all(rule["resources"] == ["leases"] for rule in lease_rules)
    assert all("*" not in rule["verbs"] and "*" not in rule["resources"] for rule in role["rules"])
    binding = one(objects, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "falcon-controller",
                                    "namespace": "falcon"}]
    assert not find(objects, "ClusterRole") and not find(objects, "ClusterRoleBinding")


def test_service_and_monitor_select_the_controller_pods(rendered: Rendered) -> None:
    objects = rendered["deploy/base"]
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    service = one(objects, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}]


def test_the_pod_monitor_scrapes_every_informers_metrics_port(rendered: Rendered) -> None:
    monitor = one(rendered["deploy/base"], "PodMonitor")
    wanted = monitor["spec"]["selector"]["matchLabels"]
    informers = [d for d in find(rendered["deploy/overlays/example"], "Deployment")
                 if d["metadata"]["labels"]["app.kubernetes.io/component"] == INFORMER]
    assert informers
    for informer in informers:
        pod = informer["spec"]["template"]
        assert wanted.items() <= pod["metadata"]["labels"].items()
        ports = {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
        assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in ports
    controller = one(rendered["deploy/base"], "Deployment")
    assert not wanted.items() <= controller["spec"]["template"]["metadata"]["labels"].items()


def test_the_overlay_sets_project_image_replicas_and_one_informer_per_edge_cluster(
    rendered: Rendered,
) -> None:
    objects = rendered["deploy/overlays/example"]
    account = one(objects, "ServiceAccount", "falcon-controller")
    assert (account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"]
            == "falcon-controller@my-central-project.iam.gserviceaccount.com")
    controller = one(objects, "Deployment", "falcon-controller")
    assert controller["spec"]["replicas"] == 3
    image = controller["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "us-central1-docker.pkg.dev/my-central-project/falcon/falcon-es:0.1.0"
    settings = one(objects, "ConfigMap")
    assert settings["data"]["GOOGLE_CLOUD_PROJECT"] == "my-central-project"
    assert settings["data"]["FALCON_LOG_FORMAT"] == "json"  # merged, not replaced
    informers = {d["metadata"]["name"]: d for d in find(objects, "Deployment")
                 if d["metadata"]["labels"]["app.kubernetes.io/component"] == INFORMER}
    assert set(informers) == {"falcon-informer-edge-a", "falcon-informer-edge-b"}
    selectors = set()
    for name, informer in informers.items():
        cluster = name.removeprefix("falcon-informer-")
        container = informer["spec"]["template"]["spec"]["containers"][0]
        assert container["args"] == ["informer", "--cluster", cluster]
        assert container["image"] == image
        assert container["envFrom"][0]["configMapRef"]["name"] == settings["metadata"]["name"]
        selectors.add(json.dumps(informer["spec"]["selector"], sort_keys=True))
    assert len(selectors) == 2, "each informer Deployment must select only its own pods"


# --------------------------------------------------------------------------- Dockerfile


def dockerfile() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    instructions = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def test_dockerfile_runs_falcon_es_as_a_non_root_user_with_json_logs() -> None:
    instructions = dockerfile()
    stages = [rest for keyword, rest in instructions if keyword == "FROM"]
    assert all("-slim" in stage for stage in stages)
    user = [rest for keyword, rest in instructions if keyword == "USER"]
    assert user and user[-1].split(":")[0] not in ("0", "root")
    assert int(user[-1].split(":")[0]) >= 1000
    assert ("ENTRYPOINT", '["falcon-es"]') in instructions
    assert ("CMD", '["run"]') in instructions
    env = " ".join(rest for keyword, rest in instructions if keyword == "ENV")
    assert "FALCON_LOG_FORMAT=json" in env
    assert any(keyword == "RUN" and re.search(r"pip install\b.*\s\.$", rest)
               for keyword, rest in instructions)


def test_dockerfile_copies_every_package_the_wheel_needs() -> None:
    copied = {source.rstrip("/") for keyword, rest in dockerfile()
              if keyword == "COPY" and not rest.startswith("--from")
              for source in rest.split()[:-1]}
    for source in copied:
        assert (ROOT / source).exists(), f"Dockerfile copies {source}, which does not exist"
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    included = config["tool"]["setuptools"]["packages"]["find"]["include"]
    top_levels = {pattern.rstrip("*").split(".")[0] for pattern in included}
    assert top_levels <= copied, f"not copied: {top_levels - copied}"
    assert "pyproject.toml" in copied and "README.md" in copied


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_venv_and_runs(tmp_path: Path) -> None:
    """The Dockerfile's steps without Docker: build the wheel, install it into a new
    venv, run ``falcon-es --help`` and ``db upgrade``. The dependencies come from the
    test environment (a .pth line), so nothing but the wheel itself is installed."""
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels),
         str(ROOT)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("falcon_es-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--quiet", str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "test-dependencies.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FALCON_")}
    env["PYTHONNOUSERSITE"] = "1"
    located = subprocess.run([str(python), "-c", "import falcon_es; print(falcon_es.__file__)"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert located.stdout.startswith(purelib), located.stdout
    falcon = venv / "bin" / "falcon-es"
    helped = subprocess.run([str(falcon), "--help"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0, helped.stderr
    assert "Falcon-ES" in helped.stdout
    upgraded = subprocess.run([str(falcon), "--db", f"sqlite:///{tmp_path / 'falcon.db'}",
                               "db", "upgrade", "--create-job-table"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "database at revision" in upgraded.stdout


# --------------------------------------------------------------------------- IAM script


def run_setup(**environ: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "DRY_RUN": "1", **environ}
    return subprocess.run(["bash", str(DEPLOY / "iam" / "setup.sh")], env=env,
                          capture_output=True, text=True, timeout=60)


def test_iam_script_parses() -> None:
    syntax = subprocess.run(["bash", "-n", str(DEPLOY / "iam" / "setup.sh")],
                            capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr


def test_iam_script_says_which_placeholder_is_missing() -> None:
    result = run_setup(EDGE_PROJECTS="edge-1")
    assert result.returncode != 0
    assert "CENTRAL_PROJECT" in result.stderr


def test_iam_script_grants_the_narrowest_edge_role_and_workload_identity() -> None:
    result = run_setup(CENTRAL_PROJECT="central", EDGE_PROJECTS="edge-1 edge-2",
                       LOG_BUCKET="falcon-logs")
    assert result.returncode == 0, result.stderr
    lines = [line.replace("\\", "") for line in result.stdout.splitlines()]
    commands = [line for line in lines if line.startswith("gcloud ")]
    text = "\n".join(commands)
    for forbidden in ("roles/container.admin", "roles/owner", "roles/editor",
                      "roles/container.developer", "keys create"):
        assert forbidden not in text
    assert ("gcloud iam service-accounts add-iam-policy-binding "
            "falcon-controller@central.iam.gserviceaccount.com --project central "
            "--role roles/iam.workloadIdentityUser "
            "--member serviceAccount:central.svc.id.goog[falcon/falcon-controller]") in text
    role_creates = [c for c in commands if c.startswith("gcloud iam roles create")]
    assert len(role_creates) == 2
    permissions = set(re.search(r"--permissions (\S+)", role_creates[0]).group(1).split(","))
    # One list: what the script grants is what ``falcon-es doctor`` tests.
    assert sorted(permissions) == sorted(EDGE_PERMISSIONS)
    assert len(EDGE_PERMISSIONS) == len(set(EDGE_PERMISSIONS))
    assert {"container.clusters.update", "container.clusters.get"} <= permissions
    assert not any(p.startswith("container.nodePools.") for p in permissions)
    for edge in ("edge-1", "edge-2"):
        assert (f"gcloud projects add-iam-policy-binding {edge} --role "
                f"projects/{edge}/roles/falconEdgeOperator --member "
                "serviceAccount:falcon-controller@central.iam.gserviceaccount.com") in text
    for topic in ("falcon-edge-events", "falcon-task-events"):
        assert f"gcloud pubsub topics create {topic} --project central" in text
        assert (f"gcloud pubsub topics add-iam-policy-binding {topic} --project central "
                "--role roles/pubsub.publisher") in text
    assert "gcloud pubsub subscriptions create falcon-edge-events-controller" in text
    assert ("gcloud pubsub subscriptions add-iam-policy-binding falcon-edge-events-controller "
            "--project central --role roles/pubsub.subscriber") in text
    assert re.search(r"subscriptions create falcon-task-events-ops .*--enable-message-ordering", text)
    assert "ns/falcon-jobs/sa/falcon-task" in text


def test_the_subscription_the_deployment_reads_is_the_one_the_script_creates(rendered: Rendered) -> None:
    settings = one(rendered["deploy/base"], "ConfigMap")["data"]
    text = run_setup(CENTRAL_PROJECT="c", EDGE_PROJECTS="e").stdout
    assert f"subscriptions create {settings['FALCON_EDGE_EVENTS_SUBSCRIPTION']} " in text
    assert f"topics create {settings['FALCON_EDGE_EVENTS_TOPIC']} " in text
    assert f"topics create {settings['FALCON_TASK_EVENTS_TOPIC']} " in text


# --------------------------------------------------------------------------- Grafana

PROMQL_WORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset", "inf", "nan",
})


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions,
    keywords, label names, label values, durations or Grafana variables."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)           # string literals
    text = re.sub(r"\{[^}]*\}", "", text)                       # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)                      # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\w+", "", text)                           # Grafana variables
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        following = text[match.end():].lstrip()
        if word.lower() in PROMQL_WORDS or following.startswith("("):
            continue
        names.add(word)
    return names


def dashboard_queries() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "falcon-es.json").read_text())
    queries = [target["expr"] for panel in dashboard["panels"]
               for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            queries.append(re.sub(r"label_values\((\w+),.*\)", r"\1", query["query"]))
    return queries


def test_metric_name_extraction() -> None:
    assert metric_names(
        'histogram_quantile(0.95, sum by (le, api) (rate(falcon_x_bucket{api=~"$a"}[5m])))'
        ' / on (instance) group_left () max by (pod) (falcon_leader == 1) and time()'
    ) == {"falcon_x_bucket", "falcon_leader"}


@pytest.fixture
def scraped() -> Iterator[str]:
    """The /metrics text of a running health server whose metrics have seen traffic."""
    import datetime as dt

    now = dt.datetime(2026, 11, 1, 9)
    states = [TaskState("t1", state="Running", cluster_name="edge-a", topology="2x2",
                        supply_mode="flex-start", submitted_at=now)]
    pools = [PoolSample("edge-a", "falcon-t1", "2x2", "flex-start", "active", "t1",
                        created_at=now - dt.timedelta(hours=2))]
    metrics = Metrics(tasks=lambda: states, pools=lambda: pools)
    metrics.observe_call("gke", "create_node_pool", RETRYABLE, 1.5)
    metrics.retry_scheduled("gke", "create_node_pool")
    with HealthServer(host="127.0.0.1", port=0, metrics=metrics.exposition) as server:
        with urllib.request.urlopen(server.url + "/metrics", timeout=5) as response:
            yield response.read().decode("utf-8")


def exported_names(text: str) -> set[str]:
    """Every series name the exposition can carry, from its families' types (a labelled
    histogram with no observation yet still lists its family)."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum",
                                                                  "_created"),
                "summary": ("_count", "_sum", "_created"), "gauge": ("",), "info": ("_info",)}
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def test_every_metric_the_dashboard_queries_is_exported(scraped: str) -> None:
    exported = exported_names(scraped)
    queried = set().union(*(metric_names(q) for q in dashboard_queries()))
    assert queried, "the dashboard queries nothing"
    missing = sorted(queried - exported)
    assert not missing, f"the dashboard queries metrics the process does not export: {missing}"


def test_the_dashboard_shows_every_falcon_metric(scraped: str) -> None:
    # *_created series are the client library's per-child creation times, not metrics.
    families = {family.name for family in text_string_to_metric_families(scraped)
                if family.name.startswith("falcon_") and not family.name.endswith("_created")}
    queried = set().union(*(metric_names(q) for q in dashboard_queries()))
    unseen = sorted(f for f in families
                    if not any(name == f or name.startswith(f + "_") for name in queried))
    assert not unseen, f"exported but on no panel: {unseen}"


def test_the_dashboard_is_well_formed() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "falcon-es.json").read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] == "falcon-es"
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
