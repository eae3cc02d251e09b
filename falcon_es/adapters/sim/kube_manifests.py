"""What the simulated Kubernetes API makes of a submitted manifest: a Job or a Service
object, or the API server's refusal (INVALID, in its words), so a bad manifest fails
here the way it would against a real cluster.

A Job's behaviour in the simulation (how long its pods run and how they end) comes
from its ``falcon-es/sim`` annotation when it has one, else from the task's
``spec.sim`` through the world's ``BehaviourSource``, else from the configured
defaults.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from falcon_es.domain.ports import INVALID, PortError
from falcon_es.domain.spec import SIM_OUTCOMES, SimBehaviour

from falcon_es.adapters.sim.common import DNS_LABEL, label_problem
from falcon_es.adapters.sim.config import JobDefaults
from falcon_es.adapters.sim.kube_objects import SimFailureRule, SimJob, SimService

#: A Job annotation carrying the task's ``spec.sim`` as JSON (optional; see SimWorld).
SIM_ANNOTATION = "falcon-es/sim"
#: The task id: the annotation holds it verbatim; the label may hold a shortened form.
TASK_ID_ANNOTATION = "falcon/task-id"
TASK_LABEL = "falcon-task"
TPU_RESOURCE = "google.com/tpu"
TPU_TAINT_KEY = "google.com/tpu"

#: A task's ``spec.sim`` by task id (the world's ``behaviour_source``): how the pods
#: of that task's Jobs behave when the Job carries no sim annotation.
BehaviourSource = Callable[[str], "Mapping[str, Any] | SimBehaviour | None"]


def parse_job(manifest: Mapping[str, Any], now: dt.datetime, defaults: JobDefaults,
              rng: random.Random, behaviour_source: Callable[[], BehaviourSource | None],
              ) -> SimJob:
    """The Job ``manifest`` asks for, submitted at ``now``; INVALID as the API server
    words it when the manifest is malformed. ``rng`` draws the Job's uid;
    ``behaviour_source`` is asked only for a Job without the sim annotation."""
    if not isinstance(manifest, Mapping):
        raise PortError(INVALID, f"Job manifest must be an object, found {type(manifest).__name__}")
    metadata = manifest.get("metadata") or {}
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    shown = name if isinstance(name, str) else ""

    def invalid(field: str, words: str) -> PortError:
        return PortError(INVALID, f'Job.batch "{shown}" is invalid: {field}: {words}')

    if manifest.get("kind", "Job") != "Job" or manifest.get("apiVersion", "batch/v1") != "batch/v1":
        raise invalid("kind", f"expected batch/v1 Job, found {manifest.get('apiVersion')} "
                              f"{manifest.get('kind')}")
    if not shown:
        raise invalid("metadata.name", "Required value: name or generateName is required")
    if not DNS_LABEL.match(shown):
        raise invalid("metadata.name", f'Invalid value: "{shown}": a lowercase RFC 1123 label '
                                       "must consist of lower case alphanumeric characters or "
                                       "'-', and must start and end with an alphanumeric "
                                       "character (at most 63 characters)")
    labels = metadata.get("labels") or {}
    problem = label_problem(labels)
    if problem:
        raise invalid("metadata.labels", problem)
    spec = manifest.get("spec")
    if not isinstance(spec, Mapping):
        raise invalid("spec", "Required value")
    template = spec.get("template")
    pod_spec = template.get("spec") if isinstance(template, Mapping) else None
    if not isinstance(pod_spec, Mapping):
        raise invalid("spec.template.spec", "Required value")
    containers = pod_spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise invalid("spec.template.spec.containers", "Required value")
    image = containers[0].get("image") if isinstance(containers[0], Mapping) else None
    if not isinstance(image, str) or not image:
        raise invalid("spec.template.spec.containers[0].image", "Required value")
    selector = pod_spec.get("nodeSelector") or {}
    problem = label_problem(selector)
    if problem:
        raise invalid("spec.template.spec.nodeSelector", problem)
    completions = _count(spec, "completions", invalid)
    parallelism = _count(spec, "parallelism", invalid)
    completions = completions or parallelism or 1
    parallelism = parallelism or 1
    backoff_limit = spec.get("backoffLimit", defaults.default_backoff_limit)
    if isinstance(backoff_limit, bool) or not isinstance(backoff_limit, int) or backoff_limit < 0:
        raise invalid("spec.backoffLimit", f"Invalid value: {backoff_limit!r}: must be greater "
                                           "than or equal to 0")
    annotations = metadata.get("annotations") or {}
    if not isinstance(annotations, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()):
        raise invalid("metadata.annotations", "expected a map of strings")
    task_label = labels.get(TASK_LABEL, "")
    task_id = annotations.get(TASK_ID_ANNOTATION) or task_label
    ttl = spec.get("ttlSecondsAfterFinished")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 0):
        raise invalid("spec.ttlSecondsAfterFinished", f"Invalid value: {ttl!r}: must be "
                                                      "greater than or equal to 0")
    rules = _failure_rules(spec.get("podFailurePolicy"), pod_spec, invalid)
    uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return SimJob(
        name=shown, uid=uid, task_id=task_id, task_label=task_label, completions=completions,
        parallelism=parallelism, backoff_limit=backoff_limit, selector=dict(selector),
        tolerates_tpu=_tolerates_tpu(pod_spec.get("tolerations")),
        tpu_per_pod=_tpu_request(containers, invalid), image=image,
        behaviour=_behaviour(annotations, task_id, invalid, defaults, behaviour_source),
        owner_id=annotations.get(TASK_ID_ANNOTATION),
        created_at=now, ttl_after_finished=ttl, failure_rules=rules,
    )


def _failure_rules(policy: Any, pod_spec: Mapping[str, Any],
                   invalid: Callable[[str, str], PortError]) -> tuple[SimFailureRule, ...]:
    """A ``podFailurePolicy``'s rules, refused as the API server refuses them: the pod
    template must have ``restartPolicy: Never``; each rule one of ``onExitCodes`` and
    ``onPodConditions``; exit codes ordered, and 0 never with ``In``."""
    if policy is None:
        return ()
    field = "spec.podFailurePolicy"
    if pod_spec.get("restartPolicy") != "Never":
        raise invalid("spec.template.spec.restartPolicy", "Invalid value: only \"Never\" is "
                      "supported when podFailurePolicy is specified")
    rules = policy.get("rules") if isinstance(policy, Mapping) else None
    if not isinstance(rules, list):
        raise invalid(f"{field}.rules", "Required value")
    out: list[SimFailureRule] = []
    for index, rule in enumerate(rules):
        where = f"{field}.rules[{index}]"
        action = rule.get("action") if isinstance(rule, Mapping) else None
        if action not in ("Ignore", "FailJob", "Count", "FailIndex"):
            raise invalid(f"{where}.action", f"Unsupported value: {action!r}")
        codes, conditions = rule.get("onExitCodes"), rule.get("onPodConditions")
        if (codes is None) == (conditions is None):
            raise invalid(where, "specifying one of onExitCodes and onPodConditions is required")
        if conditions is not None:
            out.extend(SimFailureRule(action, condition=str(c.get("type")))
                       for c in conditions if isinstance(c, Mapping))
            continue
        values, operator = codes.get("values") or [], codes.get("operator")
        if operator not in ("In", "NotIn") or values != sorted(set(values)) or not values:
            raise invalid(f"{where}.onExitCodes", "Invalid value: an operator In or NotIn and "
                          "ordered, distinct values are required")
        if operator == "In" and 0 in values:
            raise invalid(f"{where}.onExitCodes.values", "Invalid value: 0: must not be 0 "
                          "for the In operator")
        out.append(SimFailureRule(action, operator=operator, codes=frozenset(values)))
    return tuple(out)


def _count(spec: Mapping[str, Any], field: str, invalid: Callable[[str, str], PortError]) -> int | None:
    """A positive count of the Job spec (completions, parallelism); None when unset."""
    value = spec.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid(f"spec.{field}", f"Invalid value: {value!r}: must be greater than 0")
    return value


def _behaviour(annotations: Mapping[str, str], task_id: str,
               invalid: Callable[[str, str], PortError], defaults: JobDefaults,
               behaviour_source: Callable[[], BehaviourSource | None]) -> SimBehaviour:
    """How the Job's pods behave: the annotation, else the task's ``spec.sim``, else
    the defaults (see the module's docstring)."""
    raw: Any = None
    if SIM_ANNOTATION in annotations:
        try:
            raw = json.loads(annotations[SIM_ANNOTATION])
        except (TypeError, json.JSONDecodeError) as error:
            raise invalid(f"metadata.annotations[{SIM_ANNOTATION}]",
                          f"not JSON ({error})") from None
    else:
        source = behaviour_source()
        if source is not None and task_id:
            raw = source(task_id)
    if isinstance(raw, SimBehaviour):
        raw = raw.said()
    return _behaviour_from(raw, invalid, defaults)


def _behaviour_from(raw: Any, invalid: Callable[[str, str], PortError],
                    defaults: JobDefaults) -> SimBehaviour:
    """A behaviour from its JSON form (None: the defaults), checked field by field."""
    if raw is None:
        return SimBehaviour(defaults.duration_seconds, defaults.outcome, defaults.exit_code)
    field = f"metadata.annotations[{SIM_ANNOTATION}]"
    if not isinstance(raw, Mapping):
        raise invalid(field, "expected an object with duration_seconds, outcome, exit_code")
    # A field missing or null is not said: the defaults apply.
    duration = _or(raw.get("duration_seconds"), defaults.duration_seconds)
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or duration < 0:
        raise invalid(field, f"duration_seconds {duration!r}: expected seconds >= 0")
    outcome = _or(raw.get("outcome"), defaults.outcome)
    if outcome not in SIM_OUTCOMES:
        raise invalid(field, f"outcome {outcome!r}: expected one of {', '.join(SIM_OUTCOMES)}")
    exit_code = _or(raw.get("exit_code"), defaults.exit_code)
    if exit_code is not None and (isinstance(exit_code, bool) or not isinstance(exit_code, int)
                                  or not 0 <= exit_code <= 255):
        raise invalid(field, f"exit_code {exit_code!r}: expected 0-255")
    return SimBehaviour(float(duration), outcome, exit_code)


def parse_service(manifest: Mapping[str, Any]) -> SimService:
    """The Service ``manifest`` asks for; INVALID unless it is a v1 Service with a
    DNS-1035 name, as the API server requires."""
    metadata = manifest.get("metadata") or {}
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if manifest.get("kind") != "Service" or manifest.get("apiVersion") != "v1":
        raise PortError(INVALID, f"expected a v1 Service, found {manifest.get('apiVersion')} "
                                 f"{manifest.get('kind')}")
    if not isinstance(name, str) or not DNS_LABEL.match(name) or not name[0].isalpha():
        raise PortError(INVALID, f'Service "{name}" is invalid: metadata.name: Invalid value: '
                                 "a DNS-1035 label must consist of lower case alphanumeric "
                                 "characters or '-', start with an alphabetic character, and "
                                 "end with an alphanumeric character")
    spec = manifest.get("spec") or {}
    owners = tuple(str(o.get("uid")) for o in metadata.get("ownerReferences") or ()
                   if isinstance(o, Mapping) and o.get("uid"))
    return SimService(name=name, namespace=str(metadata.get("namespace") or "default"),
                      task_label=(metadata.get("labels") or {}).get(TASK_LABEL),
                      owner_uids=owners, selector=dict(spec.get("selector") or {}),
                      headless=spec.get("clusterIP") == "None",
                      owner_id=(metadata.get("annotations") or {}).get(TASK_ID_ANNOTATION))


def _tolerates_tpu(tolerations: Any) -> bool:
    """The pod tolerates the taint GKE puts on TPU nodes (``google.com/tpu=present``)."""
    for toleration in tolerations or ():
        if not isinstance(toleration, Mapping):
            continue
        key, operator = toleration.get("key"), toleration.get("operator", "Equal")
        effect = toleration.get("effect")
        if effect not in (None, "", "NoSchedule"):
            continue
        if operator == "Exists" and key in (None, "", TPU_TAINT_KEY):
            return True
        if operator == "Equal" and key == TPU_TAINT_KEY and toleration.get("value") == "present":
            return True
    return False


def _tpu_request(containers: list[Any], invalid: Callable[[str, str], PortError]) -> int:
    """The TPU chips a pod asks for, summed over its containers (limits, else requests)."""
    total = 0
    for index, container in enumerate(containers):
        resources = container.get("resources") if isinstance(container, Mapping) else None
        if not isinstance(resources, Mapping):
            continue
        for kind in ("limits", "requests"):
            amounts = resources.get(kind)
            if not isinstance(amounts, Mapping) or TPU_RESOURCE not in amounts:
                continue
            raw = amounts[TPU_RESOURCE]
            try:
                value = int(str(raw))
            except ValueError:
                raise invalid(f"spec.template.spec.containers[{index}].resources.{kind}[{TPU_RESOURCE}]",
                              f'Invalid value: "{raw}": must be a whole number') from None
            total += value
            break
    return total


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value
