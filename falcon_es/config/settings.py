"""Configuration from the environment (and CLI flags that override it)."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping

from falcon_es.config.db_urls import DEFAULT_URL
from falcon_es.config.job_mapping import JobMapping, JobMappingError
from falcon_es.domain.priority import DEFAULT_CLASSES, PriorityError, PriorityPolicy, parse_classes
from falcon_es.config.retry import RetryConfigError, RetryPolicies
from falcon_es.domain.spec import SpecLimits
from falcon_es.domain.topics import EDGE_EVENTS_TOPIC, TASK_EVENTS_TOPIC

LANGUAGES = ("en", "zh")
#: A position older than this says too little to be worth showing: the setting's ceiling.
MAX_POSITION_REFRESH_SECONDS = 3600.0
GKE_TRANSPORTS = ("grpc", "rest")
#: Which bus carries the ops stream and the edge events: the simulated world's, or
#: Pub/Sub (Google's emulator when ``PUBSUB_EMULATOR_HOST`` is set, else a project).
SIM_BUS, PUBSUB_BUS = "sim", "pubsub"
BUSES = (SIM_BUS, PUBSUB_BUS)


class SettingsError(ValueError):
    """An environment variable holds a value Falcon-ES cannot use."""


def database_url(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get("FALCON_DB_URL") or DEFAULT_URL


@dataclasses.dataclass(frozen=True)
class Settings:
    db_url: str = DEFAULT_URL
    #: The upper layer's job table and the names of its columns
    #: (``FALCON_JOB_TABLE``, ``FALCON_JOB_COLUMNS``).
    job_mapping: JobMapping = JobMapping()
    language: str = "en"
    default_timeout_seconds: int = 24 * 3600
    max_timeout_seconds: int = 7 * 24 * 3600
    #: The most slices one task may ask for (``FALCON_MAX_SLICES``).
    max_slices: int = 4
    #: A multi-slice task on a reservation with room for some of its slices creates
    #: those and holds them while it waits for the rest (``FALCON_MULTISLICE_PARTIAL_CREATE``).
    #: Off: nothing is created until every slice fits, so a waiting task holds no slice
    #: another task could run on, and two tasks each holding part of what both need
    #: can never wait on each other.
    multislice_partial_create: bool = False
    controller_id: str = "falcon-controller"
    # Task lifecycle: where Jobs run, how long steps may take, how often to retry.
    job_namespace: str = "falcon-jobs"
    job_service_account: str = "falcon-task"
    job_ttl_seconds_after_finished: int = 24 * 3600
    edge_events_topic: str = EDGE_EVENTS_TOPIC
    edge_events_subscription: str = EDGE_EVENTS_TOPIC
    #: A just-created pool may 404 on get this long (flex-start); orphans are spared too.
    create_visibility_grace_seconds: int = 300
    #: How often a running node-pool create operation is asked whether it is done: GKE
    #: creates take minutes, and each look is a call against the project's API quota.
    operation_poll_seconds: int = 5
    #: At most how often a queue's waiting tasks get their position Messages rewritten
    #: (0: on every change). A pick moves every task behind it, so rewriting on every
    #: change costs a whole queue of UPDATEs on the upper layer's table per pick; a
    #: task that joins or whose own state changes still gets its position at once.
    position_refresh_seconds: float = 30.0
    provisioning_timeout_seconds: int = 1800
    #: How long the Job controller may be refused creating a Job's pods (FailedCreate:
    #: an admission webhook, Pod Security, a quota) before the task fails
    #: JobSubmitFailed; a refusal that clears within it costs nothing.
    failed_create_grace_seconds: int = 600
    flex_start_provisioning_timeout_seconds: int = 4 * 3600
    #: Single-tenant retention: when a task's wait for nodes reaches its deadline and no
    #: task of another topology waits on its cluster, keep the pool (GKE keeps trying)
    #: until a node is Ready or the task is aborted, instead of failing NodePoolTimeout.
    retain_waiting_pool: bool = True
    #: Every backoff, in one place: per external API (failed calls) and ``wait`` (steps
    #: waiting on the world through the log). ``FALCON_RETRY_<API>_<FIELD>``.
    retry: RetryPolicies = dataclasses.field(default_factory=RetryPolicies)
    scale_down_reservation_seconds: int = 600
    scale_down_on_demand_seconds: int = 600
    scale_down_flex_start_seconds: int = 6 * 3600
    orphan_sweep_seconds: int = 300
    # The gcp backend (see docs/explanation/gcp-backend.md): where the ops stream
    # goes, which project holds the Pub/Sub topics, and API endpoints overridable for
    # local fakes and emulators.
    task_events_topic: str = TASK_EVENTS_TOPIC
    pubsub_project: str | None = None
    gke_endpoint: str | None = None
    gke_transport: str = "grpc"
    compute_endpoint: str | None = None
    #: Cloud Resource Manager (``falcon-es doctor`` tests the edge role's permissions).
    resource_manager_endpoint: str | None = None
    #: ``FALCON_BUS``: ``sim`` or ``pubsub``; None: the backend's own (the sim world's
    #: bus on the sim backend, Pub/Sub on gcp). Pub/Sub on the sim backend is a staging
    #: world whose ops stream and edge events real subscribers can read.
    bus: str | None = None
    #: How often the controller reads each cluster's reservation for the
    #: reservation-remaining gauge and ``falcon-es clusters`` (one read per reservation
    #: and topology per interval, whatever the errors).
    reservation_read_seconds: int = 60
    #: Priority classes and aging (``FALCON_PRIORITY_CLASSES``, ``FALCON_AGING_POINTS``,
    #: ``FALCON_AGING_INTERVAL``): see docs/explanation/scheduling.md.
    priorities: PriorityPolicy = PriorityPolicy()
    #: A slot holder that has not created a pool yet (ClusterBusy: its reservation is
    #: full) gives the slot up to a waiting task of higher effective priority.
    preempt_cluster_busy: bool = True
    #: A waiting task moves to another active cluster of its TPU type whose slot is
    #: free once its own queue's slot holder has been in ClusterBusy or WaitingForNode
    #: this long; at most ``max_moves`` times.
    replace_after_seconds: int = 900
    max_moves: int = 3

    @property
    def spec_limits(self) -> SpecLimits:
        """What a task's spec is checked against."""
        return SpecLimits(self.default_timeout_seconds, self.max_timeout_seconds,
                          self.max_slices, self.priorities)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        language = env.get("FALCON_LANG", "en").split("_")[0].lower() or "en"
        if language not in LANGUAGES:
            raise SettingsError(
                f"FALCON_LANG={env['FALCON_LANG']!r}: expected one of {', '.join(LANGUAGES)}"
            )
        return cls(
            db_url=database_url(env),
            job_mapping=_job_mapping(env),
            language=language,
            default_timeout_seconds=_int(env, "FALCON_DEFAULT_TIMEOUT", cls.default_timeout_seconds),
            max_timeout_seconds=_int(env, "FALCON_MAX_TIMEOUT", cls.max_timeout_seconds),
            max_slices=_count(env, "FALCON_MAX_SLICES", cls.max_slices),
            multislice_partial_create=_flag(env, "FALCON_MULTISLICE_PARTIAL_CREATE",
                                            cls.multislice_partial_create),
            controller_id=env.get("FALCON_CONTROLLER_ID") or env.get("HOSTNAME")
            or cls.controller_id,
            job_namespace=env.get("FALCON_JOB_NAMESPACE") or cls.job_namespace,
            job_service_account=env.get("FALCON_JOB_SERVICE_ACCOUNT") or cls.job_service_account,
            edge_events_subscription=env.get("FALCON_EDGE_EVENTS_SUBSCRIPTION")
            or cls.edge_events_subscription,
            edge_events_topic=env.get("FALCON_EDGE_EVENTS_TOPIC") or cls.edge_events_topic,
            task_events_topic=env.get("FALCON_TASK_EVENTS_TOPIC") or cls.task_events_topic,
            pubsub_project=env.get("FALCON_PUBSUB_PROJECT") or env.get("GOOGLE_CLOUD_PROJECT")
            or None,
            gke_endpoint=env.get("FALCON_GKE_ENDPOINT") or None,
            gke_transport=_choice(env, "FALCON_GKE_TRANSPORT", GKE_TRANSPORTS,
                                  cls.gke_transport),
            compute_endpoint=env.get("FALCON_COMPUTE_ENDPOINT") or None,
            resource_manager_endpoint=env.get("FALCON_RESOURCE_MANAGER_ENDPOINT") or None,
            bus=_choice(env, "FALCON_BUS", BUSES, "") or None,
            reservation_read_seconds=_int(
                env, "FALCON_RESERVATION_READ_SECONDS", cls.reservation_read_seconds),
            create_visibility_grace_seconds=_int(
                env, "FALCON_CREATE_VISIBILITY_GRACE", cls.create_visibility_grace_seconds),
            operation_poll_seconds=_int(
                env, "FALCON_OPERATION_POLL_SECONDS", cls.operation_poll_seconds),
            position_refresh_seconds=_seconds(
                env, "FALCON_POSITION_REFRESH_SECONDS", cls.position_refresh_seconds,
                maximum=MAX_POSITION_REFRESH_SECONDS),
            provisioning_timeout_seconds=_int(
                env, "FALCON_PROVISIONING_TIMEOUT", cls.provisioning_timeout_seconds),
            failed_create_grace_seconds=_int(
                env, "FALCON_FAILED_CREATE_GRACE", cls.failed_create_grace_seconds),
            flex_start_provisioning_timeout_seconds=_int(
                env, "FALCON_FLEX_START_PROVISIONING_TIMEOUT",
                cls.flex_start_provisioning_timeout_seconds),
            retain_waiting_pool=_flag(env, "FALCON_RETAIN_WAITING_POOL",
                                      cls.retain_waiting_pool),
            scale_down_reservation_seconds=_int(
                env, "FALCON_SCALE_DOWN_RESERVATION", cls.scale_down_reservation_seconds),
            scale_down_flex_start_seconds=_int(
                env, "FALCON_SCALE_DOWN_FLEX_START", cls.scale_down_flex_start_seconds),
            retry=_retry_policies(env),
            priorities=_priorities(env),
            preempt_cluster_busy=_flag(env, "FALCON_PREEMPT_CLUSTER_BUSY",
                                       cls.preempt_cluster_busy),
            replace_after_seconds=_int(env, "FALCON_REPLACE_AFTER_SECONDS",
                                       cls.replace_after_seconds),
            max_moves=_count(env, "FALCON_MAX_MOVES", cls.max_moves),
        )


def _priorities(env: Mapping[str, str]) -> PriorityPolicy:
    """The classes and the aging rule; a bad value is reported as every bad setting."""
    raw = env.get("FALCON_PRIORITY_CLASSES", "").strip()
    try:
        classes = parse_classes(raw) if raw else DEFAULT_CLASSES
    except PriorityError as error:
        raise SettingsError(f"FALCON_PRIORITY_CLASSES={raw!r}: {error}") from None
    points_raw = env.get("FALCON_AGING_POINTS", "").strip()
    try:
        points = int(points_raw) if points_raw else PriorityPolicy.points
    except ValueError:
        raise SettingsError(f"FALCON_AGING_POINTS={points_raw!r}: expected a whole number") from None
    if points < 0:
        raise SettingsError(f"FALCON_AGING_POINTS={points_raw!r}: must be 0 (no aging) or more")
    return PriorityPolicy(classes, points,
                          _int(env, "FALCON_AGING_INTERVAL", PriorityPolicy.interval_seconds))


def _job_mapping(env: Mapping[str, str]) -> JobMapping:
    """The job table's names, a bad value reported as every other bad setting is."""
    try:
        mapping = JobMapping.from_env(env)
    except JobMappingError as error:
        raise SettingsError(str(error)) from None
    return dataclasses.replace(
        mapping, priority_requests=_flag(env, "FALCON_JOB_PRIORITY_REQUESTS", False))


def _retry_policies(env: Mapping[str, str]) -> RetryPolicies:
    """The retry policies, a bad value reported as every other bad setting is."""
    try:
        return RetryPolicies.from_env(env)
    except RetryConfigError as error:
        raise SettingsError(str(error)) from None


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected a whole number of seconds") from None
    if value <= 0:
        raise SettingsError(f"{name}={raw!r}: must be positive")
    return value


_TRUE, _FALSE = frozenset({"true", "1", "yes", "on"}), frozenset({"false", "0", "no", "off"})


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    """A yes/no setting: true/false (also 1/0, yes/no, on/off, any case)."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in _TRUE | _FALSE:
        raise SettingsError(f"{name}={raw!r}: expected true or false")
    return value in _TRUE


def _count(env: Mapping[str, str], name: str, default: int) -> int:
    """A positive whole number that counts things, not seconds."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected a whole number") from None
    if value <= 0:
        raise SettingsError(f"{name}={raw!r}: must be positive")
    return value


def _seconds(env: Mapping[str, str], name: str, default: float, *, maximum: float) -> float:
    """A duration in seconds that may be fractional or 0, up to ``maximum``."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise SettingsError(f"{name}={raw!r}: must be 0 or more seconds")
    if value > maximum:
        raise SettingsError(f"{name}={raw!r}: at most {maximum:g} seconds")
    return value


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw not in choices:
        raise SettingsError(f"{name}={raw!r}: expected one of {', '.join(choices)}")
    return raw
