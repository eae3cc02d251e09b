"""Generated malformed task specs never crash intake and never stop other tasks.

Most cases run against ``parse_spec`` in-process (thousands, fast); a smaller batch of
generated rows goes through the controller on both databases, mixed with good rows.
Every malformed spec must end with a Reason and a Message that names the field.
"""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from falcon_es.jobtable import job_rows
from falcon_es.app.application import App
from falcon_es.engine.runtime import Controller
from falcon_es.domain.spec import (
    FORBIDDEN_FIELDS,
    KNOWN_FIELDS,
    SpecError,
    TaskSpec,
    parse_spec,
)
from falcon_es.storage.tables import JobTable
from falcon_es.domain.tpu import TPU_TYPES
from falcon_es.projections.messages import render
from tests.test_scheduling import add_cluster, controller

#: The job table under Falcon-ES's own names, as the fixtures create it.
job = JobTable().table

GOOD = {"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e", "topology": "2x2",
        "command": ["python", "train.py"], "env": {"STEPS": "10"}, "supply_mode": "flex-start",
        "timeout_seconds": 3600, "display_name": "train", "sim": {"duration_seconds": 5}}
REASONS = {"InvalidSpec", "UnknownField", "ForbiddenField", "MissingField", "InvalidField",
           "UnknownTpuType", "InvalidTopology"}
FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

INJECTIONS = (
    "'; DROP TABLE job; --", "\" OR 1=1 --", "$(rm -rf /)", "`reboot`", "{{7*7}}", "${jndi:ldap://x/a}",
    "<script>alert(1)</script>", "../../etc/passwd", "\x00", "\r\nX-Injected: 1", "%s%s%n",
    "\ud800", "\U0001f600" * 3, "privileged: true", "hostPath: /", "\u202etxt.exe",
)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                         st.floats(allow_nan=True, allow_infinity=True),
                         st.text(max_size=20), st.sampled_from(INJECTIONS))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=6)
nasty_text = st.one_of(st.text(max_size=40), st.sampled_from(INJECTIONS),
                       st.builds(lambda a, b: a + b, st.sampled_from(INJECTIONS), st.text(max_size=10)))


def outcome(raw: Any) -> SpecError | TaskSpec:
    """parse_spec's verdict; anything but SpecError escaping is a bug."""
    try:
        return parse_spec(raw)
    except SpecError as error:
        return error


def assert_rejected_naming_field(raw: Any) -> SpecError:
    result = outcome(raw)
    assert isinstance(result, SpecError), f"accepted a malformed spec: {raw!r:.200}"
    assert result.reason in REASONS
    assert result.field
    message = render("TaskRejected", {"field": result.field, "detail": result.detail})
    assert result.field in message
    assert len(message) < 1200, "a bad spec cannot flood the Message"
    message.encode("utf-8")  # storable in any database
    return result


def with_field(field: str, value: Any) -> dict[str, Any]:
    spec = dict(GOOD)
    spec[field] = value
    return spec


# --------------------------------------------------------------------- in-process


@settings(FUZZ, max_examples=1000)
@given(st.sampled_from(sorted(KNOWN_FIELDS)), json_values)
def test_wrong_types_in_any_field(field: str, value: Any) -> None:
    result = outcome(with_field(field, value))
    if isinstance(result, TaskSpec):
        # Only a value the field accepts may pass: check it really is one.
        assert result.tpu_type in TPU_TYPES and result.image
        return
    assert result.reason in REASONS
    assert result.field.split(".")[0].split("[")[0] in (field, "spec") or result.field.startswith(
        ("env.", "sim.", "command[", "args["))
    assert_rejected_naming_field(with_field(field, value))


@settings(FUZZ, max_examples=400)
@given(st.sets(st.sampled_from(("image", "tpu_type", "topology")), min_size=1),
       st.dictionaries(st.text(min_size=1, max_size=30), json_values, max_size=3))
def test_missing_required_and_unknown_fields(missing: set[str], extra: dict[str, Any]) -> None:
    spec = {k: v for k, v in GOOD.items() if k not in missing}
    spec.update({k: v for k, v in extra.items() if k not in KNOWN_FIELDS})
    error = assert_rejected_naming_field(spec)
    assert error.reason in ("MissingField", "UnknownField", "ForbiddenField")


@settings(FUZZ, max_examples=800)
@given(st.sampled_from(sorted(TPU_TYPES)), st.one_of(
    st.text(alphabet="0123456789x-+. e", max_size=30),
    st.lists(st.integers(-5, 10**6), min_size=1, max_size=6).map(lambda d: "x".join(map(str, d))),
    st.sampled_from(("", "0x0", "1x1x1x1", "２x２", "2X2", " 2x2", "2x2\n", "1e3x1",
                     "99999999999999999999x2", "-2x-2", "NaN", "2x2; rm -rf /")),
))
def test_absurd_topologies(tpu_type: str, topology: str) -> None:
    assume(topology not in TPU_TYPES[tpu_type].topologies)
    error = assert_rejected_naming_field({**GOOD, "tpu_type": tpu_type, "topology": topology})
    assert error.field == "topology"


@settings(FUZZ, max_examples=300)
@given(st.sampled_from(("image", "tpu_type", "topology", "display_name", "command", "args",
                        "env", "supply_mode")),
       st.integers(4097, 300_000), st.sampled_from("aZ9/é漢"))
def test_huge_strings(field: str, length: int, char: str) -> None:
    text = char * length
    value: Any = {"command": [text], "args": ["ok", text], "env": {"BIG": text * 8}}.get(field, text)
    assert_rejected_naming_field(with_field(field, value))
    assert_rejected_naming_field(json.dumps(with_field(field, value)))


@settings(FUZZ, max_examples=1000)
@given(st.sampled_from(("image", "tpu_type", "topology", "supply_mode", "key", "env-name",
                        "sim.outcome", "forbidden")), nasty_text)
def test_injection_looking_text(where: str, text: str) -> None:
    if where == "key":
        assume(text not in KNOWN_FIELDS)
        spec = {**GOOD, text: "x"}
    elif where == "env-name":
        spec = {**GOOD, "env": {text: "x"}}
        assume(not (text and text[0] in string.ascii_letters + "_"
                    and all(c in string.ascii_letters + string.digits + "_" for c in text)))
    elif where == "sim.outcome":
        spec = {**GOOD, "sim": {"outcome": text}}
    elif where == "forbidden":
        key = sorted(FORBIDDEN_FIELDS)[len(text) % len(FORBIDDEN_FIELDS)]
        spec = {**GOOD, key.upper() if len(text) % 2 else key: text}
    else:
        spec = with_field(where, text)
    result = outcome(spec)
    if isinstance(result, TaskSpec):  # e.g. a random string that is a real topology
        if where == "supply_mode":
            assert text == "" and result.supply_mode is None, "empty means the default"
        elif where == "sim.outcome":  # one of the outcomes the simulator knows
            assert result.sim is not None and result.sim.outcome == text
        else:
            assert where == "image" or getattr(result, where, None) == text
        return
    assert_rejected_naming_field(spec)
    assert_rejected_naming_field(json.dumps(spec))


@settings(FUZZ, max_examples=600)
@given(st.one_of(json_values, st.text(max_size=60), st.binary(max_size=60)))
def test_anything_at_all_as_the_spec(raw: Any) -> None:
    result = outcome(raw)
    if isinstance(result, SpecError):
        assert_rejected_naming_field(raw)


@settings(FUZZ, max_examples=200)
@given(st.text(max_size=30).map(lambda t: "{" + t), st.integers(1, 5000))
def test_broken_and_deep_json_text(prefix: str, depth: int) -> None:
    assert_rejected_naming_field(prefix)
    assert_rejected_naming_field("[" * depth + "]" * (depth - 1))


# --------------------------------------------------------------------- through the controller


malformed_specs = st.one_of(
    st.tuples(st.sampled_from(sorted(KNOWN_FIELDS)), json_values).map(lambda p: with_field(*p)),
    st.dictionaries(st.text(min_size=1, max_size=12), json_values, max_size=4),
    st.sampled_from(INJECTIONS).map(lambda t: {**GOOD, "topology": t}),
    st.sampled_from(INJECTIONS).map(lambda t: {**GOOD, t: 1}),
    st.sampled_from(sorted(FORBIDDEN_FIELDS)).map(lambda k: {**GOOD, k: True}),
    json_values,
)


@pytest.fixture
def running(app: App) -> Controller:
    add_cluster(app, "tpu-a")
    return controller(app)


@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(malformed_specs, min_size=5, max_size=12))
def test_a_batch_of_bad_rows_fails_each_alone(app: App, running: Controller, specs: list[Any]) -> None:
    """One controller serves every example (hypothesis reuses the fixtures)."""
    ctl = running
    bad_ids = []
    good_ids = []
    for spec in specs:
        good_ids.append(job_rows.submit(app.engine, name="good", actor="ok", spec=GOOD,
                                        now=app.clock.now()))
        task_id = job_rows.submit(app.engine, name="fuzz", actor="fuzzer", spec={},
                                  now=app.clock.now())
        try:
            with app.engine.begin() as conn:
                conn.execute(job.update().where(job.c.id == task_id).values(spec=spec))
        except sa.exc.DBAPIError:
            # The database itself refuses it (MariaDB's JSON check rejects a lone
            # surrogate escape), so no upper layer could have written this row.
            with app.engine.begin() as conn:
                conn.execute(job.delete().where(job.c.id == task_id))
            continue
        bad_ids.append((task_id, spec))
    ctl.tick()
    for task_id, spec in bad_ids:
        row = job_rows.get_row(app.engine, task_id)
        expected = outcome(json.dumps(spec))  # what the row holds: the spec as JSON text
        if isinstance(expected, TaskSpec):
            assert row["status"] == "Pending"
            continue
        assert (row["status"], row["reason"]) == ("Failed", expected.reason)
        assert expected.field in row["message"]
    for task_id in good_ids:
        assert job_rows.get_row(app.engine, task_id)["status"] == "Pending"
