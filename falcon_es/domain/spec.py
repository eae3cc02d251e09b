"""The task spec (JSON in ``job.spec``): parsing and validation.

A bad spec fails its own task with a Reason and a Message naming the field and what
was expected; it never raises past intake. Nothing a spec says can make the Job
privileged, mount host paths, use the host network, or leave its namespace or
service account: such fields are refused by name.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from falcon_es.domain.priority import PriorityError, PriorityPolicy
from falcon_es.domain.tpu import (
    TPU_TYPES, TopologyError, machine_types, multi_host_machine, slice_shape,
)

RESERVATION, ON_DEMAND, FLEX_START = "reservation", "on-demand", "flex-start"
SUPPLY_MODES = (RESERVATION, ON_DEMAND, FLEX_START)
#: The longest a flex-start node lives (GKE "About flex-start": up to seven days;
#: ``NodeConfig.max_run_duration``); GKE deletes it then, with the pods on it.
FLEX_START_MAX_RUN_SECONDS = 7 * 24 * 3600


def autoscaled(supply_mode: str | None) -> bool:
    """A flex-start pool is created with autoscaling 0..N and no nodes: the cluster
    autoscaler adds nodes only for Pending pods that need them, so its workload is
    submitted as soon as the control plane is RUNNING. Reservation and on-demand pools
    are fixed-size: their nodes come with the create, and the workload follows them."""
    return supply_mode == FLEX_START


#: Reasons of rows failed before their spec is read: a column of the row holds what
#: Falcon-ES cannot use; the row's id does not fit the log.
INVALID_COLUMN = "InvalidColumn"
INVALID_ID = "InvalidId"
#: Reason of a row whose id the log knows as another submission (a reused id).
DUPLICATE_ID = "DuplicateId"
#: Reason of a row whose first append (and what it leads to) the database refused.
UNSTORABLE_ROW = "UnstorableRow"
#: ``node-repair``: GKE repairs the slice's nodes once, midway through the run (every
#: pod evicted with the ``DisruptionTarget`` condition); the recreated pods then succeed.
#: ``jobs-refused``: the namespace's ResourceQuota on Jobs is used up, so the API server
#: refuses the task's Jobs (a JobSet's controller records JobCreationFailed on it).
SIM_OUTCOMES = ("succeed", "fail", "oom", "image-pull-error", "unschedulable", "create-denied",
                "node-repair", "jobs-refused")

#: Fields that would reach into the pod's security boundary. Refused, not ignored.
FORBIDDEN_FIELDS = frozenset({
    "privileged", "securitycontext", "security_context", "hostpath", "host_path",
    "hostnetwork", "host_network", "hostpid", "host_pid", "hostipc", "host_ipc",
    "namespace", "serviceaccount", "service_account", "serviceaccountname",
    "service_account_name", "volumes", "volumemounts", "volume_mounts", "capabilities",
    "nodename", "node_name", "automountserviceaccounttoken", "runasuser", "run_as_user",
})
KNOWN_FIELDS = frozenset({
    "image", "command", "args", "env", "tpu_type", "topology", "supply_mode",
    "timeout_seconds", "display_name", "sim", "slices", "max_restarts", "priority",
    "machine_type",
    "retry_exit_codes",
})
MAX_STRING = 4096
MAX_LIST = 256
MAX_ENV = 128
MAX_ENV_VALUE = 32 * 1024
MAX_SPEC_BYTES = 256 * 1024
#: The most whole-JobSet restarts a multi-slice task may ask for.
MAX_RESTARTS = 100
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# An OCI reference: [registry[:port]/]path[:tag][@digest], no whitespace or control chars.
_IMAGE = re.compile(
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
)


class SpecError(ValueError):
    """Why a spec is rejected: a Reason for the job table, the field, and a detail."""

    def __init__(self, reason: str, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.reason = reason
        self.field = field
        self.detail = detail


@dataclasses.dataclass(frozen=True)
class SpecLimits:
    default_timeout_seconds: int = 24 * 3600
    max_timeout_seconds: int = 7 * 24 * 3600
    #: The most slices (node pools, one JobSet child Job each) one task may ask for.
    max_slices: int = 1
    #: The priority classes and range a spec's ``priority`` is read against.
    priorities: PriorityPolicy = PriorityPolicy()


@dataclasses.dataclass(frozen=True)
class SimBehaviour:
    """How a simulated workload behaves, as far as the spec says: a field left None is
    not said, and the sim config's ``jobs`` defaults apply to it."""

    duration_seconds: float | None = None
    outcome: str | None = None
    exit_code: int | None = None

    def said(self) -> dict[str, Any]:
        """The fields the spec set (the sim fills in the rest from its defaults)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    image: str
    tpu_type: str
    topology: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    supply_mode: str | None = None
    timeout_seconds: int = 24 * 3600
    display_name: str | None = None
    #: How a simulated workload behaves. None when the spec names none: the sim's
    #: configured Job defaults apply (to any field it leaves out, too).
    sim: SimBehaviour | None = None
    #: Slices of ``topology`` the task runs on: 1 is a Job on one pool, more a JobSet
    #: with one child Job per slice, each on a pool of its own.
    slices: int = 1
    #: Whole-JobSet restarts (``failurePolicy.maxRestarts``) of a multi-slice task.
    max_restarts: int = 0
    #: Higher is served first (a class name in the spec is stored as its value).
    priority: int = 0
    #: The machine type of the slice's VMs, for the one shape two make (v5e/v6e 2x4:
    #: one 8-chip or two 4-chip VMs); None: ``tpu.choose_machine`` decides.
    machine_type: str | None = None
    #: The workload's exit codes worth another attempt (bounded by ``max_restarts``);
    #: any other non-zero exit code fails the task at once (the pod failure policy).
    retry_exit_codes: tuple[int, ...] = ()

    def to_data(self) -> dict[str, Any]:
        """The fields as JSON data, in declaration order (``dataclasses.asdict``'s
        result, built without its deep copies: intake and every Job manifest ask)."""
        data = {name: getattr(self, name) for name in _SPEC_FIELDS}
        data["sim"] = None if self.sim is None else dataclasses.asdict(self.sim)
        data["command"] = list(self.command)
        data["args"] = list(self.args)
        data["retry_exit_codes"] = list(self.retry_exit_codes)
        data["env"] = {k: v for k, v in self.env}
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, Any], tpu_type: str, topology: str) -> TaskSpec:
        """The spec a stored ``TaskAccepted`` carries (``to_data``'s form), read back
        without validating it again: intake did before it entered the log. A field the
        data lacks or holds as null (a spec recorded before the field existed, or a
        hand-built one) takes the default declared above, so readers need none of their
        own; the TPU type and topology default to the event's.

        A replay reads one per task, so it is built without the frozen ``__init__``."""
        fields = {**_SPEC_DEFAULTS, "tpu_type": tpu_type, "topology": topology}
        for name, value in data.items():
            if value is not None and name in fields:
                fields[name] = value
        command, args, env, sim = fields["command"], fields["args"], fields["env"], data.get("sim")
        if type(fields["retry_exit_codes"]) is not tuple:
            fields["retry_exit_codes"] = tuple(fields["retry_exit_codes"])
        if type(command) is not tuple:
            fields["command"] = tuple(command)
        if type(args) is not tuple:
            fields["args"] = tuple(args)
        if type(env) is not tuple:
            fields["env"] = tuple(sorted(env.items() if isinstance(env, Mapping) else env))
        fields["sim"] = None if sim is None else SimBehaviour(**sim)
        spec = object.__new__(cls)
        object.__setattr__(spec, "__dict__", fields)
        return spec


#: ``TaskSpec``'s field names, in declaration order (``TaskSpec.to_data``).
_SPEC_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TaskSpec))


#: Every field of ``TaskSpec`` and its default (``image`` has none: ""), for ``from_data``.
_SPEC_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    field.name: "" if field.default is dataclasses.MISSING else field.default
    for field in dataclasses.fields(TaskSpec)})


#: The longest whole number a spec may write, in digits: Python refuses to read more
#: than 4,300 (a ``ValueError`` out of ``json.loads``), and no field wants more than a few.
MAX_DIGITS = 30


class _Unusable:
    """What the decoder puts where a value cannot be used (a number too long, NaN or
    Infinity, text that is not UTF-8), so the walk that follows names its field."""

    __slots__ = ("detail",)

    def __init__(self, detail: str) -> None:
        self.detail = detail


class _Pairs(dict):  # type: ignore[type-arg]
    """An object whose text named a key twice: the controller would read the last
    value and MariaDB's JSON functions the first, so it is refused, never resolved."""

    duplicate: str | None = None


def load_spec(raw: Any) -> Any:
    """Decode the stored spec (text, UTF-8 bytes or already-decoded JSON). In text,
    numbers too long to convert, NaN and Infinity, duplicate keys and bytes that are
    not UTF-8 are refused here, naming the field they are in (decoded data met the
    field checks instead, which refuse such values by range and type)."""
    if raw is None:
        raise SpecError("InvalidSpec", "spec", "missing: expected a JSON object")
    if isinstance(raw, (bytes, bytearray)):
        # surrogateescape keeps each stray byte as a lone surrogate, so the walk
        # below can name the field that holds it.
        raw = bytes(raw).decode("utf-8", errors="surrogateescape")
    if isinstance(raw, str):
        if len(raw) > MAX_SPEC_BYTES:
            raise SpecError("InvalidSpec", "spec", f"{len(raw)} bytes, at most {MAX_SPEC_BYTES}")
        try:
            data = json.loads(raw, object_pairs_hook=_pairs, parse_int=_whole_number,
                              parse_constant=_constant)
        except (json.JSONDecodeError, RecursionError) as error:
            raise SpecError("InvalidSpec", "spec", f"not valid JSON ({_short(str(error))})") from None
        except ValueError as error:  # whatever else the decoder refuses: that row alone
            raise SpecError("InvalidSpec", "spec", f"not readable JSON ({_short(str(error))})") from None
        _refuse_unusable(data)
        return data
    return raw


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = _Pairs()
    for key, value in pairs:
        if key in obj and obj.duplicate is None:
            obj.duplicate = key
        obj[key] = value
    return obj


def _whole_number(text: str) -> Any:
    digits = len(text.lstrip("-"))
    if digits > MAX_DIGITS:
        return _Unusable(f"a number of {digits} digits, at most {MAX_DIGITS}")
    return int(text)


def _constant(name: str) -> Any:
    return _Unusable(f"{name} is not a number a spec may hold")


def _refuse_unusable(data: Any) -> None:
    """Walk the decoded spec (iteratively: its depth is the text's) and refuse the
    first unusable value found, by its path."""
    stack: list[tuple[str, Any]] = [("spec", data)]
    while stack:
        path, value = stack.pop()
        problem = _problem(value)
        if problem is not None:
            raise SpecError("InvalidSpec", path, problem)
        if isinstance(value, Mapping):
            for key, item in reversed(list(value.items())):
                if _stray_bytes(str(key)):
                    raise SpecError("InvalidSpec", _child(path, key),
                                    "field name is not UTF-8 text")
                stack.append((_child(path, key), item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{index}]", item)
                         for index, item in reversed(list(enumerate(value))))


def _problem(value: Any) -> str | None:
    """Why one decoded value cannot be used (None: it can, as far as decoding goes)."""
    if isinstance(value, _Unusable):
        return value.detail
    if isinstance(value, _Pairs) and value.duplicate is not None:
        return (f"names {_label(value.duplicate, 40)} twice (each field once: readers "
                "disagree on which value counts)")
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return f"{value} is not a number a spec may hold"
    if isinstance(value, int) and not isinstance(value, bool) and \
            value.bit_length() > MAX_DIGITS * 4:
        return f"a number of more than {MAX_DIGITS} digits"
    if isinstance(value, str) and _stray_bytes(value):
        return "is not UTF-8 text (bytes no character encodes)"
    return None


def _stray_bytes(text: str) -> bool:
    """Whether text holds a byte that was not UTF-8 (kept by surrogateescape)."""
    return any("\udc80" <= c <= "\udcff" for c in text)


def _child(path: str, key: Any) -> str:
    name = _label(key, 40)
    return name if path == "spec" else f"{path}.{name}"


def parse_spec(raw: Any, limits: SpecLimits = SpecLimits()) -> TaskSpec:
    data = load_spec(raw)
    if not isinstance(data, Mapping):
        raise SpecError("InvalidSpec", "spec", f"expected a JSON object, found {_kind(data)}")
    for key in data:
        if not isinstance(key, str):
            raise SpecError("UnknownField", "spec", f"field names must be strings, found {key!r}")
        if key.lower().replace("-", "_") in FORBIDDEN_FIELDS or key.lower() in FORBIDDEN_FIELDS:
            raise SpecError("ForbiddenField", _label(key),
                            "not allowed: a task cannot set pod security, host access, "
                            "volumes, namespace or service account")
    unknown = sorted(k for k in data if k not in KNOWN_FIELDS)
    if unknown:
        raise SpecError("UnknownField", _label(unknown[0]),
                        f"unknown field; expected one of {', '.join(sorted(KNOWN_FIELDS))}")
    image = _string(data, "image", required=True)
    if not _IMAGE.match(image):
        raise SpecError("InvalidField", "image", f"{_short(image)!r} is not an image reference")
    tpu_type = _string(data, "tpu_type", required=True)
    if tpu_type not in TPU_TYPES:
        raise SpecError("UnknownTpuType", "tpu_type",
                        f"{_short(tpu_type)!r}; expected one of {', '.join(sorted(TPU_TYPES))}")
    topology = _string(data, "topology", required=True)
    try:
        slice_shape(tpu_type, topology)
    except TopologyError as error:
        raise SpecError("InvalidTopology", "topology", _short(str(error), 300)) from None
    supply_mode = data.get("supply_mode")
    if supply_mode in ("", None):
        supply_mode = None
    elif supply_mode not in SUPPLY_MODES:
        raise SpecError("InvalidField", "supply_mode",
                        f"{_short(repr(supply_mode))}; expected one of {', '.join(SUPPLY_MODES)} or empty")
    timeout = data.get("timeout_seconds", limits.default_timeout_seconds)
    if not _is_int(timeout) or timeout <= 0:
        raise SpecError("InvalidField", "timeout_seconds",
                        f"{_short(repr(timeout))}; expected a positive whole number of seconds")
    if timeout > limits.max_timeout_seconds:
        raise SpecError("InvalidField", "timeout_seconds",
                        f"{timeout} exceeds the ceiling of {limits.max_timeout_seconds}")
    if supply_mode == FLEX_START and timeout > FLEX_START_MAX_RUN_SECONDS:
        raise SpecError("InvalidField", "timeout_seconds",
                        f"{timeout} s cannot fit in a flex-start node's life of at most "
                        f"{FLEX_START_MAX_RUN_SECONDS} s (7 days): GKE deletes the node then; "
                        "ask for less, or another supply_mode")
    display_name = data.get("display_name")
    if display_name is not None:
        display_name = _string(data, "display_name", max_length=255)
    slices, max_restarts, retry_exit_codes = _slices(data, limits)
    machine_type = _machine_type(data, tpu_type, topology, slices)
    try:
        priority = limits.priorities.resolve(data.get("priority", 0))
    except PriorityError as error:
        raise SpecError("InvalidField", "priority", _short(str(error), 300)) from None
    return TaskSpec(
        image=image, tpu_type=tpu_type, topology=topology,
        command=_strings(data, "command"), args=_strings(data, "args"), env=_env(data),
        supply_mode=supply_mode, timeout_seconds=timeout, display_name=display_name,
        sim=_sim(data.get("sim")), slices=slices, max_restarts=max_restarts,
        priority=priority, machine_type=machine_type, retry_exit_codes=retry_exit_codes,
    )


def _machine_type(data: Mapping[str, Any], tpu_type: str, topology: str,
                  slices: int) -> str | None:
    """The spec's ``machine_type``, one that makes the topology; and a multi-slice task
    on a shape that can be multi-host (GKE Multislice runs only on multi-host TPU
    slice node pools, kubernetes-engine/docs/how-to/tpu-multislice)."""
    machine = data.get("machine_type")
    if machine is not None:
        machine = _string(data, "machine_type", max_length=64)
        try:
            shape = slice_shape(tpu_type, topology, machine)
        except TopologyError as error:
            raise SpecError("InvalidField", "machine_type", _short(str(error), 300)) from None
        if slices > 1 and not shape.multi_host:
            raise SpecError("InvalidField", "slices",
                            f"{slices} slices of {tpu_type} {topology} on {machine}: GKE "
                            "Multislice runs only on multi-host TPU slices, and that is "
                            "one VM")
        return machine
    if slices > 1 and multi_host_machine(tpu_type, topology) is None:
        (only,) = machine_types(tpu_type, topology)
        raise SpecError("InvalidField", "slices",
                        f"{slices} slices of {tpu_type} {topology}: GKE Multislice runs "
                        f"only on multi-host TPU slices, and {topology} is one VM ({only})")
    return None


def _slices(data: Mapping[str, Any], limits: SpecLimits) -> tuple[int, int, tuple[int, ...]]:
    """``slices``, ``max_restarts`` and ``retry_exit_codes``. A multi-slice task's
    restarts are its JobSet's whole; a single-slice task (a Job) may be restarted only
    for the exit codes it names as worth retrying, since any other exit code fails it
    at once (docs/reference/task-spec.md, 'Failures and disruptions')."""
    slices = data.get("slices", 1)
    if not _is_int(slices) or not 1 <= slices <= limits.max_slices:
        raise SpecError("InvalidField", "slices",
                        f"{_short(repr(slices))}; expected a whole number from 1 to "
                        f"{limits.max_slices} (FALCON_MAX_SLICES)")
    restarts = data.get("max_restarts", 0)
    if not _is_int(restarts) or not 0 <= restarts <= MAX_RESTARTS:
        raise SpecError("InvalidField", "max_restarts",
                        f"{_short(repr(restarts))}; expected a whole number from 0 to {MAX_RESTARTS}")
    codes = _exit_codes(data.get("retry_exit_codes"))
    if restarts and slices == 1 and not codes:
        raise SpecError("InvalidField", "max_restarts",
                        "restarts apply to multi-slice tasks (slices of 2 or more) or to the "
                        "exit codes named in retry_exit_codes")
    return slices, restarts, codes


def _exit_codes(value: Any) -> tuple[int, ...]:
    """The exit codes worth a retry: distinct whole numbers 1-255, at most 255 of them
    (a pod failure policy's ``onExitCodes.values`` holds at most 255), sorted."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > 255:
        raise SpecError("InvalidField", "retry_exit_codes",
                        "expected a list of at most 255 exit codes")
    for index, code in enumerate(value):
        if not _is_int(code) or not 1 <= code <= 255:
            raise SpecError("InvalidField", f"retry_exit_codes[{index}]",
                            f"{_short(repr(code))}; expected a whole number 1-255")
    return tuple(sorted(set(value)))


def _string(data: Mapping[str, Any], field: str, *, required: bool = False,
            max_length: int = MAX_STRING) -> str:
    value = data.get(field)
    if value is None:
        if required:
            raise SpecError("MissingField", field, "required")
        return ""
    if not isinstance(value, str):
        raise SpecError("InvalidField", field, f"expected a string, found {_kind(value)}")
    if not value.strip():
        raise SpecError("InvalidField", field, "must not be empty")
    if len(value) > max_length:
        raise SpecError("InvalidField", field, f"{len(value)} characters, at most {max_length}")
    if any(ord(c) < 32 and c not in "\t\n" for c in value):
        raise SpecError("InvalidField", field, "contains control characters")
    _check_unicode(field, value)
    return value


def _strings(data: Mapping[str, Any], field: str) -> tuple[str, ...]:
    value = data.get(field)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SpecError("InvalidField", field, f"expected a list of strings, found {_kind(value)}")
    if len(value) > MAX_LIST:
        raise SpecError("InvalidField", field, f"{len(value)} items, at most {MAX_LIST}")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise SpecError("InvalidField", f"{field}[{index}]", f"expected a string, found {_kind(item)}")
        if len(item) > MAX_STRING:
            raise SpecError("InvalidField", f"{field}[{index}]", f"{len(item)} characters, at most {MAX_STRING}")
        if "\x00" in item:
            raise SpecError("InvalidField", f"{field}[{index}]", "contains a NUL character")
        _check_unicode(f"{field}[{index}]", item)
    return tuple(value)


def _env(data: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    value = data.get("env")
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise SpecError("InvalidField", "env", f"expected an object of NAME: value, found {_kind(value)}")
    if len(value) > MAX_ENV:
        raise SpecError("InvalidField", "env", f"{len(value)} variables, at most {MAX_ENV}")
    pairs = []
    for name, val in value.items():
        if not _ENV_NAME.match(name):
            raise SpecError("InvalidField", f"env.{_label(name, 40)}", "not a valid variable name")
        if not isinstance(val, str):
            raise SpecError("InvalidField", f"env.{name}", f"expected a string, found {_kind(val)}")
        if len(val) > MAX_ENV_VALUE or "\x00" in val:
            raise SpecError("InvalidField", f"env.{name}", f"value too long or contains NUL (at most {MAX_ENV_VALUE})")
        _check_unicode(f"env.{name}", val)
        pairs.append((name, val))
    return tuple(sorted(pairs))


def _sim(value: Any) -> SimBehaviour | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SpecError("InvalidField", "sim", f"expected an object, found {_kind(value)}")
    allowed = {"duration_seconds", "outcome", "exit_code"}
    unknown = sorted(k for k in value if k not in allowed)
    if unknown:
        raise SpecError("UnknownField", f"sim.{_label(unknown[0], 40)}",
                        f"unknown field; expected one of {', '.join(sorted(allowed))}")
    duration = value.get("duration_seconds")
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, (int, float))
                                 or not 0 <= duration <= 10**7):
        raise SpecError("InvalidField", "sim.duration_seconds", "expected seconds between 0 and 10000000")
    outcome = value.get("outcome")
    if outcome is not None and outcome not in SIM_OUTCOMES:
        raise SpecError("InvalidField", "sim.outcome",
                        f"{_short(repr(outcome))}; expected one of {', '.join(SIM_OUTCOMES)}")
    exit_code = value.get("exit_code")
    if exit_code is not None and (not _is_int(exit_code) or not 0 <= exit_code <= 255):
        raise SpecError("InvalidField", "sim.exit_code", "expected a whole number 0-255")
    return SimBehaviour(None if duration is None else float(duration), outcome, exit_code)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")


def _label(name: Any, limit: int = 80) -> str:
    """A field name as a Message can show it: as written when plain, otherwise quoted
    and escaped (an empty name, control characters, lone surrogates, markup)."""
    text = str(name)
    return text if _PLAIN_NAME.match(text) and len(text) <= limit else _short(repr(text), limit)


def _check_unicode(field: str, value: str) -> None:
    """Lone surrogates decode from JSON escapes but cannot be stored or sent anywhere."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise SpecError("InvalidField", field, "is not valid Unicode text (lone surrogate)") from None


def _short(text: str, limit: int = 80) -> str:
    """Bound what a bad spec can put into a Message."""
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
