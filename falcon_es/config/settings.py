"""Every setting of Falcon-ES, declared once: grouped, each field with its variable,
type, default and one line of doc.

``Settings.from_env`` is the one reader of the environment (its variables are put in
place by ``falcon_es.config.source``); ``Settings()`` alone is the defaults, whatever the
environment holds, so a test or a benchmark states what it changes. Command-line
flags are overrides applied when the settings are built (``overrides``), never a
second reading of a variable. ``falcon_es.config.reference`` writes the reference
page from these declarations.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from falcon_es.config.db_urls import DEFAULT_URL
from falcon_es.config.errors import LeaseConfigError, ObservabilityConfigError, SettingsError
from falcon_es.config.fields import (
    Count,
    Flag,
    Number,
    OptionalText,
    Seconds,
    Text,
    Whole,
    one_of,
    seconds_up_to,
    setting,
)
from falcon_es.config.job_mapping import DEFAULT_TABLE, JobMapping, check_columns, check_table
from falcon_es.config.retry import RetryConfigError, RetryPolicies, RetrySettings
from falcon_es.config.source import Variables, refused
from falcon_es.domain.priority import DEFAULT_CLASSES, PriorityError, PriorityPolicy, parse_classes
from falcon_es.domain.spec import SpecLimits
from falcon_es.domain.topics import EDGE_EVENTS_TOPIC, TASK_EVENTS_TOPIC

__all__ = [
    "BUSES", "PUBSUB_BUS", "SIM_BUS", "Settings", "SettingsError", "LeaseConfigError",
    "ObservabilityConfigError",
]

LANGUAGES = ("en", "zh")
#: A position older than this says too little to be worth showing: the setting's ceiling.
MAX_POSITION_REFRESH_SECONDS = 3600.0
GKE_TRANSPORTS = ("grpc", "rest")
#: Which bus carries the ops stream and the edge events: the simulated world's, or
#: Pub/Sub (Google's emulator when ``PUBSUB_EMULATOR_HOST`` is set, else a project).
SIM_BUS, PUBSUB_BUS = "sim", "pubsub"
BUSES = (SIM_BUS, PUBSUB_BUS)
BACKENDS = ("sim", "gcp")
LEADER_ELECTIONS = ("lease", "none", "db")
LOG_FORMATS = ("json", "text")
#: client-go's JitterFactor: followers retry after retry_period * (1 + up to 1.2).
JITTER_FACTOR = 1.2
_FROZEN = ConfigDict(frozen=True, extra="forbid")


def _language(value: Any) -> str:
    """``en`` or ``zh``; a locale such as ``zh_CN`` names its language."""
    language = str(value).split("_")[0].lower() or "en"
    if language not in LANGUAGES:
        raise ValueError(f"expected one of {', '.join(LANGUAGES)}")
    return language


def _port(value: Any) -> int:
    text = str(value).strip()
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise ValueError("expected a port number 0-65535")
    return int(text)


def _positive_age(value: Any) -> float:
    try:
        age = float(value)
    except ValueError:
        age = -1.0
    if age <= 0:
        raise ValueError("expected a positive number of seconds")
    return age


def _aging_points(value: Any) -> int:
    try:
        points = int(str(value).strip())
    except ValueError:
        raise ValueError("expected a whole number") from None
    if points < 0:
        raise ValueError("must be 0 (no aging) or more")
    return points


def _classes(value: Any) -> str:
    try:
        parse_classes(str(value))
    except PriorityError as error:
        raise ValueError(str(error)) from None
    return str(value)


class DatabaseSettings(BaseModel):
    """Where the log lives and who appends to it."""

    model_config = _FROZEN

    db_url: Text = setting(DEFAULT_URL, "FALCON_DB_URL",
                           doc="Database URL: sqlite:///file.db or mysql+pymysql://user:pass@host/db")
    controller_id: Text = setting("falcon-controller", "FALCON_CONTROLLER_ID", "HOSTNAME",
                                  doc="Who appends, recorded with every commit (the pod's "
                                      "name in Kubernetes)")
    connect_timeout: Seconds = setting(
        5, "FALCON_DB_CONNECT_TIMEOUT",
        doc="Seconds a controller waits for a new database connection")
    read_timeout: Seconds = setting(
        10, "FALCON_DB_READ_TIMEOUT",
        doc="Seconds a controller waits for the database's answer to a statement before "
            "it counts the database as hung (MySQL/MariaDB)")
    write_timeout: Seconds = setting(
        10, "FALCON_DB_WRITE_TIMEOUT",
        doc="Seconds a controller waits to send a statement to the database (MySQL/MariaDB)")
    lock_wait_timeout: Seconds = setting(
        5, "FALCON_DB_LOCK_WAIT_TIMEOUT",
        doc="Seconds a statement waits for a row lock (innodb_lock_wait_timeout) or for "
            "SQLite's write lock (busy timeout) before it is retried")
    idle_transaction_timeout: Seconds = setting(
        8, "FALCON_DB_IDLE_TRANSACTION_TIMEOUT",
        doc="Seconds the database keeps a controller's write transaction that went quiet "
            "(a frozen process) before it ends its connection and frees its locks "
            "(MariaDB's idle_write_transaction_timeout); keep it below the lease")
    lock_timeout: Seconds = setting(
        15, "FALCON_DB_LOCK_TIMEOUT",
        doc="With --leader-election db: seconds the database keeps the controller lock of "
            "a holder that stopped answering (its connection's wait_timeout)")
    outage_limit: Seconds = setting(
        300, "FALCON_DB_OUTAGE_LIMIT",
        doc="Seconds a controller retries an unreachable or hung database before it "
            "exits (rc 3) for its restarter")
    batch_writes: Flag = setting(
        True, "FALCON_DB_BATCH_WRITES",
        doc="MySQL/MariaDB: send an append's writes as one multi-statement query (one "
            "round trip); false sends each statement alone, for a proxy between the "
            "controller and the database that refuses multi-statement queries")

    @model_validator(mode="after")
    def _bounded_waits(self) -> DatabaseSettings:
        if self.lock_wait_timeout >= self.read_timeout:
            raise ValueError(
                f"FALCON_DB_LOCK_WAIT_TIMEOUT={self.lock_wait_timeout} must be shorter than "
                f"FALCON_DB_READ_TIMEOUT={self.read_timeout}: a lock wait should end as a "
                "retried lock timeout, not as a hung database")
        if self.idle_transaction_timeout >= self.lock_timeout:
            raise ValueError(
                f"FALCON_DB_IDLE_TRANSACTION_TIMEOUT={self.idle_transaction_timeout} must be "
                f"shorter than FALCON_DB_LOCK_TIMEOUT={self.lock_timeout}: a frozen "
                "holder's transaction must end before its lock passes to a successor")
        return self


class JobTableSettings(BaseModel):
    """The upper layer's job table: its name, the names of its columns and the
    language of the Messages written to it."""

    model_config = _FROZEN

    table: Annotated[str, BeforeValidator(check_table)] = setting(
        DEFAULT_TABLE, "FALCON_JOB_TABLE",
        doc="The job table: table, or database.table in another database on the same server")
    columns: Annotated[str, BeforeValidator(check_columns)] = setting(
        "", "FALCON_JOB_COLUMNS",
        doc="Columns named otherwise, as falcon_name=table_name pairs separated by commas")
    language: Annotated[str, BeforeValidator(_language)] = setting(
        "en", "FALCON_LANG", doc="Language of the Messages written to the job table: en or zh")
    quiet_poll_seconds: Number = setting(
        1.0, "FALCON_JOB_QUIET_POLL",
        doc="After a read of the job table that found no new row, seconds of the "
            "controller's clock before it is read again (0: every tick reads it)")


class LifecycleSettings(BaseModel):
    """A task's life: limits of its spec, where its Job runs, how long each step may
    take, how often the world is looked at, when idle pools go."""

    model_config = _FROZEN

    default_timeout_seconds: Seconds = setting(
        24 * 3600, "FALCON_DEFAULT_TIMEOUT", doc="A task's run time limit when its spec names none")
    max_timeout_seconds: Seconds = setting(
        7 * 24 * 3600, "FALCON_MAX_TIMEOUT", doc="The longest run time limit a spec may ask for")
    max_slices: Count = setting(4, "FALCON_MAX_SLICES",
                                doc="The most slices one task may ask for")
    job_namespace: Text = setting("falcon-jobs", "FALCON_JOB_NAMESPACE",
                                  doc="Namespace of the tasks' Jobs on the edge clusters")
    job_service_account: Text = setting("falcon-task", "FALCON_JOB_SERVICE_ACCOUNT",
                                        doc="Kubernetes service account the tasks' pods run as")
    job_ttl_seconds_after_finished: Seconds = setting(
        24 * 3600, "FALCON_JOB_TTL_SECONDS_AFTER_FINISHED",
        doc="How long a finished Job stays on its edge cluster before Kubernetes deletes it")
    create_visibility_grace_seconds: Seconds = setting(
        300, "FALCON_CREATE_VISIBILITY_GRACE",
        doc="How long a just-created pool may be missing on get (flex-start); orphans are "
            "spared as long")
    operation_poll_seconds: Seconds = setting(
        5, "FALCON_OPERATION_POLL_SECONDS",
        doc="How often a running node-pool create operation is asked whether it is done")
    provisioning_timeout_seconds: Seconds = setting(
        1800, "FALCON_PROVISIONING_TIMEOUT",
        doc="How long a task may wait for its nodes (reservation and on-demand pools)")
    flex_start_provisioning_timeout_seconds: Seconds = setting(
        4 * 3600, "FALCON_FLEX_START_PROVISIONING_TIMEOUT",
        doc="How long a task may wait for its nodes on a flex-start pool")
    disruption_budget: Count = setting(
        5, "FALCON_DISRUPTION_BUDGET",
        doc="How many disruptions (pods killed by a node repair, upgrade, drain or "
            "preemption, which the Job recreates) a task may suffer; the next fails it")
    failed_create_grace_seconds: Seconds = setting(
        600, "FALCON_FAILED_CREATE_GRACE",
        doc="How long the Job controller may be refused creating a Job's pods before the "
            "task fails JobSubmitFailed")
    scale_down_reservation_seconds: Seconds = setting(
        600, "FALCON_SCALE_DOWN_RESERVATION",
        doc="How long an idle pool on a reservation is kept for a next task")
    scale_down_on_demand_seconds: Seconds = setting(
        600, "FALCON_SCALE_DOWN_ON_DEMAND",
        doc="How long an idle on-demand pool is kept for a next task")
    scale_down_flex_start_seconds: Seconds = setting(
        6 * 3600, "FALCON_SCALE_DOWN_FLEX_START",
        doc="How long an idle flex-start pool is kept for a next task")
    orphan_sweep_seconds: Seconds = setting(
        300, "FALCON_ORPHAN_SWEEP_SECONDS",
        doc="How often the edge clusters are swept for pools and Jobs no task owns")
    reservation_read_seconds: Seconds = setting(
        60, "FALCON_RESERVATION_READ_SECONDS",
        doc="How often each cluster's reservation is read for the remaining-capacity gauge")


class SchedulingSettings(BaseModel):
    """Who runs next: priority classes and aging, moves to another cluster, how often
    waiting positions are rewritten."""

    model_config = _FROZEN

    position_refresh_seconds: Annotated[
        float, seconds_up_to(MAX_POSITION_REFRESH_SECONDS)] = setting(
        30.0, "FALCON_POSITION_REFRESH_SECONDS",
        doc="At most how often a queue's waiting tasks get their position Messages "
            "rewritten (0: on every change)")
    priority_classes: Annotated[str, BeforeValidator(_classes)] = setting(
        ",".join(f"{name}={value}" for name, value in DEFAULT_CLASSES), "FALCON_PRIORITY_CLASSES",
        doc="Priority classes a spec may name, as name=value pairs separated by commas")
    aging_points: Annotated[int, BeforeValidator(_aging_points)] = setting(
        PriorityPolicy.points, "FALCON_AGING_POINTS",
        doc="Points a waiting task gains per aging interval (0: no aging)")
    aging_interval_seconds: Seconds = setting(
        PriorityPolicy.interval_seconds, "FALCON_AGING_INTERVAL",
        doc="Seconds of waiting per step of aging")
    replace_after_seconds: Seconds = setting(
        900, "FALCON_REPLACE_AFTER_SECONDS",
        doc="A waiting task moves to a free cluster of its TPU type once its queue's slot "
            "holder has been stuck this long; so does a ClusterBusy holder holding nothing, "
            "to one whose reservation has room")
    max_moves: Count = setting(3, "FALCON_MAX_MOVES",
                               doc="How many times one task may move to another cluster")

    @functools.cached_property
    def priorities(self) -> PriorityPolicy:
        """The classes and the aging rule, as the queue book reads them."""
        return PriorityPolicy(parse_classes(self.priority_classes), self.aging_points,
                              self.aging_interval_seconds)


class Features(BaseModel):
    """Behaviour switches: each turns a way of scheduling or running on or off."""

    model_config = _FROZEN

    retain_waiting_pool: Flag = setting(
        True, "FALCON_RETAIN_WAITING_POOL",
        doc="A task whose wait for nodes reaches its deadline keeps its pool while no task "
            "of another topology waits on its cluster")
    preempt_cluster_busy: Flag = setting(
        True, "FALCON_PREEMPT_CLUSTER_BUSY",
        doc="A slot holder in ClusterBusy gives the slot up to a waiting task of higher "
            "effective priority")
    best_effort_fifo: Flag = setting(
        True, "FALCON_BEST_EFFORT_FIFO",
        doc="A slot holder in ClusterBusy that holds nothing lends the slot to the first "
            "waiting task of its queue that needs another supply mode, and goes on the "
            "moment its reservation has room; false keeps strict FIFO (the slot idles)")
    multislice_partial_create: Flag = setting(
        False, "FALCON_MULTISLICE_PARTIAL_CREATE",
        doc="A multi-slice task creates the slices that fit and holds them while it waits "
            "for the rest")
    priority_requests: Flag = setting(
        False, "FALCON_JOB_PRIORITY_REQUESTS",
        doc="The job table has the priority columns, through which the upper layer asks "
            "for a waiting task's priority to change")
    pool_upgrade_exclusion: Flag = setting(
        True, "FALCON_POOL_UPGRADE_EXCLUSION",
        doc="On a cluster enrolled in a release channel (where node auto-upgrade cannot be "
            "off), each TPU pool is created with GKE's per-pool maintenance exclusion until "
            "end of support, so node upgrades do not recreate running slices")
    in_process_informers: Flag = setting(
        False, "FALCON_IN_PROCESS_INFORMERS",
        doc="With the gcp backend, the controller also watches every active cluster itself "
            "(instead of informer Deployments)")


class GcpSettings(BaseModel):
    """The gcp backend's APIs: endpoints overridable for local fakes and emulators."""

    model_config = _FROZEN

    gke_endpoint: OptionalText = setting(None, "FALCON_GKE_ENDPOINT",
                                         doc="GKE API endpoint (default: Google's)")
    gke_transport: Annotated[str, one_of(*GKE_TRANSPORTS)] = setting(
        "grpc", "FALCON_GKE_TRANSPORT", doc="How the GKE client talks: grpc or rest")
    compute_endpoint: OptionalText = setting(None, "FALCON_COMPUTE_ENDPOINT",
                                             doc="Compute Engine API endpoint (default: Google's)")
    resource_manager_endpoint: OptionalText = setting(
        None, "FALCON_RESOURCE_MANAGER_ENDPOINT",
        doc="Cloud Resource Manager endpoint (falcon-es doctor tests permissions there)")
    pubsub_project: OptionalText = setting(
        None, "FALCON_PUBSUB_PROJECT", "GOOGLE_CLOUD_PROJECT",
        doc="Project that holds the Pub/Sub topics (default: the credentials' project)")
    pubsub_emulator_host: OptionalText = setting(
        None, "PUBSUB_EMULATOR_HOST",
        doc="Google's Pub/Sub emulator, host:port (then no project is needed)")
    storage_emulator_host: OptionalText = setting(
        None, "STORAGE_EMULATOR_HOST",
        doc="A Cloud Storage emulator, http://host:port, that falcon-es logs reads task "
            "logs from with anonymous credentials (default: Cloud Storage itself)")


class BusSettings(BaseModel):
    """Where the ops stream and the edge events travel."""

    model_config = _FROZEN

    kind: Annotated[str | None, one_of(*BUSES)] = setting(
        None, "FALCON_BUS",
        doc="sim or pubsub (default: the backend's own; pubsub on the sim backend is a "
            "staging world)")
    edge_events_topic: Text = setting(EDGE_EVENTS_TOPIC, "FALCON_EDGE_EVENTS_TOPIC",
                                      doc="Topic the informers publish edge observations to")
    edge_events_subscription: Text = setting(
        EDGE_EVENTS_TOPIC, "FALCON_EDGE_EVENTS_SUBSCRIPTION",
        doc="Subscription the controller pulls edge observations from")
    task_events_topic: Text = setting(TASK_EVENTS_TOPIC, "FALCON_TASK_EVENTS_TOPIC",
                                      doc="Topic the ops stream (every event) goes to")


class RunSettings(BaseModel):
    """How ``falcon-es run`` runs (its flags override these)."""

    model_config = _FROZEN

    backend: Annotated[str, one_of(*BACKENDS)] = setting(
        "sim", "FALCON_BACKEND", doc="The world the controller acts on: sim or gcp")
    leader_election: Annotated[str | None, one_of(*LEADER_ELECTIONS)] = setting(
        None, "FALCON_LEADER_ELECTION",
        doc="lease, db or none (default: lease in a Kubernetes cluster with the gcp "
            "backend, else db)")
    kubernetes_service_host: OptionalText = setting(
        None, "KUBERNETES_SERVICE_HOST",
        doc="Set by Kubernetes in every pod: this process runs in a cluster")


class LeaseSettings(BaseModel):
    """Where the leader election's Lease lives and its timing, checked as client-go
    checks them."""

    model_config = _FROZEN

    name: Text = setting("falcon-controller", "FALCON_LEASE_NAME", doc="The Lease's name")
    namespace: Text = setting("falcon", "FALCON_LEASE_NAMESPACE", doc="The Lease's namespace")
    lease_duration: Number = setting(
        15.0, "FALCON_LEASE_DURATION",
        doc="Seconds a follower waits after the last renewal it saw before taking over")
    renew_deadline: Number = setting(
        10.0, "FALCON_LEASE_RENEW_DEADLINE",
        doc="Seconds the leader counts itself leader after the start of its last renewal")
    retry_period: Number = setting(2.0, "FALCON_LEASE_RETRY_PERIOD",
                                   doc="Seconds between renewals (and a follower's tries)")
    pod_name: OptionalText = setting(
        None, "POD_NAME", doc="This replica's name in the election (default: the hostname)")

    @classmethod
    def checked(cls, **values: Any) -> LeaseSettings:
        """Lease settings given in code (an elector's arguments), refused as
        ``LeaseConfigError`` like those read from the environment."""
        try:
            return cls(**values)
        except ValidationError as error:
            raise refused(error, cls, {}, LeaseConfigError) from None

    @model_validator(mode="after")
    def _safe(self) -> LeaseSettings:
        for field, variable in (("lease_duration", "FALCON_LEASE_DURATION"),
                                ("renew_deadline", "FALCON_LEASE_RENEW_DEADLINE"),
                                ("retry_period", "FALCON_LEASE_RETRY_PERIOD")):
            value = getattr(self, field)
            if not value > 0 or value == float("inf"):
                raise LeaseConfigError(f"{variable}={value}: expected a positive "
                                       "number of seconds")
        if self.lease_duration != int(self.lease_duration):
            raise LeaseConfigError(f"FALCON_LEASE_DURATION={self.lease_duration}: the Lease "
                                   "holds whole seconds; expected a whole number")
        if self.lease_duration <= self.renew_deadline:
            raise LeaseConfigError(
                f"FALCON_LEASE_DURATION={self.lease_duration:g} must be longer than "
                f"FALCON_LEASE_RENEW_DEADLINE={self.renew_deadline:g}: the difference is the "
                "margin in which a leader that lost the lease has stopped before another "
                "may start")
        if self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            raise LeaseConfigError(
                f"FALCON_LEASE_RENEW_DEADLINE={self.renew_deadline:g} must be longer than "
                f"{JITTER_FACTOR} x FALCON_LEASE_RETRY_PERIOD={self.retry_period:g}, or one "
                "failed renewal loses the lease")
        if not self.name or not self.namespace:
            raise LeaseConfigError("FALCON_LEASE_NAME and FALCON_LEASE_NAMESPACE must not be "
                                   "empty")
        return self


class CallSettings(BaseModel):
    """Calls to the clouds and edge clusters: what one call may cost, and how many run
    at once per cluster (see docs/design-notes/cluster-isolation.md). The clients make
    no retries of their own: each call costs its deadline once, and the product's own
    paced retries (``retry``) are the only ones."""

    model_config = _FROZEN

    connect_timeout_seconds: Number = setting(
        5.0, "FALCON_CALL_CONNECT_TIMEOUT",
        doc="Seconds a call to a Kubernetes API may take to connect")
    read_timeout_seconds: Number = setting(
        20.0, "FALCON_CALL_READ_TIMEOUT",
        doc="Seconds a call may wait for its answer (a Google API call's whole deadline)")
    per_cluster: Count = setting(
        4, "FALCON_CALLS_PER_CLUSTER",
        doc="Calls on behalf of one cluster that run at once (its own worker threads)")
    answer_max_age_seconds: Number = setting(
        2.0, "FALCON_CALL_ANSWER_MAX_AGE",
        doc="Seconds a read's answer is used by the handlers before it is asked again")


class ObservabilitySettings(BaseModel):
    """Where the health server listens, how stale a tick may be, how logs look."""

    model_config = _FROZEN

    health_host: Text = setting("0.0.0.0", "FALCON_HEALTH_HOST",
                                doc="Address /healthz, /readyz and /metrics listen on")
    health_port: Annotated[int, BeforeValidator(_port)] = setting(
        8080, "FALCON_HEALTH_PORT", doc="Port /healthz, /readyz and /metrics listen on")
    max_tick_age_seconds: Annotated[float, BeforeValidator(_positive_age)] = setting(
        60.0, "FALCON_HEALTH_MAX_TICK_AGE",
        doc="/healthz fails once the last tick is older than this many seconds")
    log_format: Annotated[str, one_of(*LOG_FORMATS, fold=str.lower)] = setting(
        "text", "FALCON_LOG_FORMAT", doc="Log lines as text or one JSON object each")
    log_level: Annotated[str, BeforeValidator(lambda value: str(value).upper())] = setting(
        "INFO", "FALCON_LOG_LEVEL", doc="DEBUG, INFO, WARNING or ERROR")


#: Each group's error class, so a caller can catch one group's by name.
GROUP_ERRORS: Mapping[str, type[SettingsError]] = MappingProxyType({
    "lease": LeaseConfigError, "observability": ObservabilityConfigError,
    "retry": RetryConfigError,
})


class Settings(BaseSettings):
    """All settings, by group. ``Settings(db_url=...)`` may name a field of any group
    by its own name (each name is unique), the shorthand of tests and benchmarks."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    database: DatabaseSettings = DatabaseSettings()
    job_table: JobTableSettings = JobTableSettings()
    lifecycle: LifecycleSettings = LifecycleSettings()
    scheduling: SchedulingSettings = SchedulingSettings()
    features: Features = Features()
    gcp: GcpSettings = GcpSettings()
    bus: BusSettings = BusSettings()
    run: RunSettings = RunSettings()
    lease: LeaseSettings = LeaseSettings()
    observability: ObservabilitySettings = ObservabilitySettings()
    retry: RetrySettings = RetrySettings()
    calls: CallSettings = CallSettings()

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only what the caller passes: the environment is read by ``from_env`` alone."""
        return (init_settings,)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return ungrouped(data) if isinstance(data, dict) else data

    @classmethod
    def of(cls, **fields: Any) -> Settings:
        """The defaults with ``fields`` changed, each named without its group
        (``Settings.of(db_url=url, language="zh")``), for commands and benchmarks that
        build their own settings."""
        return cls.model_validate(fields)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None,
                 overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Settings:
        """The settings the environment (``environ``, else the process's) holds, with
        ``overrides`` (group -> field -> value: the command line's flags) on top. A bad
        value raises one ``SettingsError`` naming the variable and what is wrong."""
        read = Variables(cls, os.environ if environ is None else environ)()
        for group, values in (overrides or {}).items():
            read[group] = {**read.get(group, {}), **values}
        try:
            return cls(**read)
        except ValidationError as error:
            raise refused(error, cls, GROUP_ERRORS) from None

    def overridden(self, **groups: Mapping[str, Any]) -> Settings:
        """These settings with some fields of some groups changed (a command's flags)."""
        data: dict[str, Any] = {name: getattr(self, name) for name in type(self).model_fields}
        for group, values in groups.items():
            model = getattr(self, group)  # rebuilt, not copied: a copy keeps cached values
            given = {name: getattr(model, name) for name in model.model_fields_set}
            data[group] = type(model)(**{**given, **values})
        return type(self)(**data)

    @functools.cached_property
    def job_mapping(self) -> JobMapping:
        """The job table's name and column names, as the SQL reads them."""
        return JobMapping.parse(self.job_table.table, self.job_table.columns,
                                priority_requests=self.features.priority_requests)

    @functools.cached_property
    def spec_limits(self) -> SpecLimits:
        """What a task's spec is checked against."""
        lifecycle = self.lifecycle
        return SpecLimits(lifecycle.default_timeout_seconds, lifecycle.max_timeout_seconds,
                          lifecycle.max_slices, self.scheduling.priorities)


def ungrouped(data: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments with fields named without their group put into their group;
    the composite values of earlier versions (a ``JobMapping``, a ``RetryPolicies``, a
    ``PriorityPolicy``) given as the fields they stand for."""
    grouped: dict[str, Any] = {}
    # Whole groups first, so a field named on its own wins over its group's value.
    for key, value in sorted(data.items(), key=lambda item: _flattened(*item) != {item[0]: {}}):
        for group, fields in _flattened(key, value).items():
            if group in Settings.model_fields and not fields:
                grouped[group] = value
            else:
                grouped[group] = {**_as_dict(grouped.get(group)), **fields}
    return grouped


def _flattened(key: str, value: Any) -> dict[str, dict[str, Any]]:
    if isinstance(value, JobMapping):
        return {"job_table": {"table": value.qualified, "columns": value.columns_text},
                "features": {"priority_requests": value.priority_requests}}
    if isinstance(value, RetryPolicies):
        return {"retry": dict(RetrySettings.of(value))}
    if isinstance(value, PriorityPolicy):
        return {"scheduling": {
            "priority_classes": ",".join(f"{n}={v}" for n, v in value.classes),
            "aging_points": value.points, "aging_interval_seconds": value.interval_seconds}}
    if key == "bus" and (value is None or isinstance(value, str)):
        return {"bus": {"kind": value}}
    if key in Settings.model_fields:
        return {key: {}}
    for group, field in Settings.model_fields.items():
        model = field.annotation
        if isinstance(model, type) and issubclass(model, BaseModel) and key in model.model_fields:
            return {group: {key: value}}
    return {key: {}}  # refused by extra="forbid", naming the key


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        return {name: getattr(value, name) for name in value.model_fields_set}
    return dict(value or {})
