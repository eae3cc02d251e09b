"""The event store: optimistic concurrency, atomic multi-stream appends, reads, upcasting."""

from __future__ import annotations

import dataclasses
import json
import datetime as dt
from types import MappingProxyType
from typing import ClassVar

import hypothesis
import hypothesis.strategies
import pytest
import sqlalchemy as sa

from falcon_es.domain import events as ev
from falcon_es.app.application import App
from falcon_es.storage.store import ConcurrencyError, Meta, StreamAppend
from falcon_es.storage.tables import task_events

META = Meta(actor="tester", causation_id="c-1", correlation_id="corr-1")


def accepted(name: str = "t") -> ev.TaskAccepted:
    return ev.TaskAccepted(name, "user-a", {"image": "i"}, "v6e", "2x2", dt.datetime(2026, 11, 1, 8))


def test_append_assigns_versions_and_consecutive_seq(app: App) -> None:
    recorded = app.store.append([
        StreamAppend("a", 0, (accepted("a"), ev.NoActiveCluster("v6e", ())), META),
        StreamAppend("b", 0, (accepted("b"),), META),
    ])
    assert [(r.stream_id, r.version, r.seq) for r in recorded] == [("a", 1, 1), ("a", 2, 2), ("b", 1, 3)]
    assert app.store.head() == 3
    again = app.store.append([StreamAppend("a", 2, (ev.NoActiveCluster("v6e", ()),), META)])
    assert again[0].version == 3 and again[0].seq == 4


def test_wrong_expected_version_writes_nothing_in_any_stream(app: App) -> None:
    app.store.append([StreamAppend("a", 0, (accepted("a"),), META)])
    with pytest.raises(ConcurrencyError, match="stream a: expected version 0, found 1"):
        app.store.append([
            StreamAppend("b", 0, (accepted("b"),), META),
            StreamAppend("a", 0, (accepted("a"),), META),
        ])
    assert app.store.read_stream("b") == []
    assert app.store.head() == 1
    assert app.tasks.get("b") is None


def test_illegal_transition_rolls_back_the_whole_tick(app: App) -> None:
    from falcon_es.domain.chart import IllegalTransition

    with pytest.raises(IllegalTransition, match="task x: event JobSucceeded is not allowed in state New"):
        app.store.append([
            StreamAppend("ok", 0, (accepted("ok"),), META),
            StreamAppend("x", 0, (ev.JobSucceeded(1),), META),
        ])
    assert app.store.head() == 0
    with app.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(task_events)).scalar() == 0


def test_read_stream_and_read_after_in_batches(app: App) -> None:
    for i in range(7):
        app.store.append([StreamAppend(f"s{i}", 0, (accepted(f"s{i}"),), META)])
    batches = list(app.store.read_batches(2, batch_size=2))
    assert [[r.seq for r in b] for b in batches] == [[3, 4], [5, 6], [7]]
    assert [r.seq for r in app.store.read_after(5)] == [6, 7]
    assert [r.seq for r in app.store.read_after(0, until=2)] == [1, 2]
    (only,) = app.store.read_stream("s3")
    assert only.event == accepted("s3")
    assert only.meta == {"actor": "tester", "causation_id": "c-1", "correlation_id": "corr-1"}


def test_read_for_fold_decodes_the_named_types_like_read_batches(app: App, clock) -> None:
    clock.advance(0.5)
    app.store.append([StreamAppend("a", 0, (accepted("a"), ev.NoActiveCluster("v6e", ({"name": "c", "status": "offline"},))), META)])
    app.store.append([StreamAppend("cluster-1", None, (ev.ClusterRegistered(
        "c-1", "gke-a", "p", "l", "v6e", "b", None, "active"),), META)])
    clock.advance(1.25)
    app.store.append([StreamAppend("b", 0, (accepted("b"),), META)])
    wanted = {"TaskAccepted", "NoActiveCluster"}
    batches = list(app.store.read_for_fold(wanted, batch_size=2))
    full = [(r.stream_id, r.event, r.recorded_at) for r in app.store.read_after(0)
            if r.type_name in wanted]
    assert [tuple(r) for batch in batches for r in batch] == full
    assert [len(batch) for batch in batches] == [2, 1]  # the cluster event read, not kept
    assert full[-1][2].microsecond == 750000
    assert [tuple(r) for b in app.store.read_for_fold(wanted, until=2) for r in b] == full[:2]


def test_recorded_at_keeps_microseconds(app: App, clock) -> None:
    clock.advance(0.123456)
    app.store.append([StreamAppend("a", 0, (accepted(),), META)])
    (record,) = app.store.read_stream("a")
    assert record.recorded_at.microsecond == 123456


def test_seq_at_finds_the_position_at_a_moment(app: App, clock) -> None:
    app.store.append([StreamAppend("a", 0, (accepted("a"),), META)])
    moment = clock.now()
    clock.advance(60)
    app.store.append([StreamAppend("b", 0, (accepted("b"),), META)])
    assert app.store.seq_at(moment) == 1
    assert app.store.seq_at(moment - dt.timedelta(seconds=1)) == 0


@dataclasses.dataclass(frozen=True)
class Renamed(ev.Event):
    """Version 2 renamed ``size`` to ``slices`` and added ``unit``."""

    schema_version: ClassVar[int] = 2
    slices: int
    unit: str


def test_upcaster_chain_turns_old_data_into_the_current_version() -> None:
    registry = MappingProxyType({"Renamed": Renamed})
    upcasters = MappingProxyType({
        ("Renamed", 1): lambda d: {"slices": d.pop("size"), "unit": "slice"},
    })
    event = ev.decode("Renamed", 1, {"size": 4}, registry=registry, upcasters=upcasters)
    assert event == Renamed(slices=4, unit="slice")
    assert ev.decode("Renamed", 2, {"slices": 2, "unit": "vm"}, registry=registry,
                     upcasters=upcasters) == Renamed(2, "vm")
    with pytest.raises(ev.UnknownEventType, match="no upcaster for Renamed v1"):
        ev.decode("Renamed", 1, {"size": 4}, registry=registry, upcasters=MappingProxyType({}))


def test_every_registered_event_round_trips_through_json() -> None:
    for name, cls in ev.REGISTRY.items():
        assert name == cls.__name__
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen


def test_an_events_stored_text_is_json_dumps_of_its_data() -> None:
    """The append encodes with an encoder built once: its text stays byte for byte what
    ``json.dumps`` of ``to_data`` gives (datetimes, tuples of dicts, non-ASCII text)."""
    from falcon_es.bench.store import plan
    from falcon_es.domain.event_json import fields_text

    events = [e for tick in plan(200, 50).ticks for a in tick for e in a.events]
    events += [accepted("任务-ü\"\n"), ev.NoActiveCluster("v6e", ("a", "b")),
               ev.JobFailed("OOMKilled", 137)]
    for event in events:
        assert event.to_json_text() == json.dumps(event.to_data())
    assert fields_text(META.to_data()) == json.dumps(META.to_data())
    with pytest.raises(TypeError, match="not JSON serializable"):
        fields_text({"at": dt.date(2026, 11, 1)})


_JSON_VALUES = hypothesis.strategies.recursive(
    hypothesis.strategies.none() | hypothesis.strategies.booleans()
    | hypothesis.strategies.integers() | hypothesis.strategies.floats(allow_nan=False)
    | hypothesis.strategies.text(),
    lambda inner: hypothesis.strategies.lists(inner, max_size=4)
    | hypothesis.strategies.dictionaries(hypothesis.strategies.text(), inner, max_size=4),
    max_leaves=12)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(value=_JSON_VALUES, before=hypothesis.strategies.sampled_from(["", " ", "\n"]),
                  after=hypothesis.strategies.sampled_from(["", " ", "\t\n"]),
                  ascii_only=hypothesis.strategies.booleans())
def test_stored_json_reads_as_json_loads_reads_it(value: object, before: str, after: str,
                                                  ascii_only: bool) -> None:
    """The replay's decoder (the C scanner called directly) gives what ``json.loads``
    gives, whitespace around the text included."""
    from falcon_es.domain.event_json import json_value

    text = before + json.dumps(value, ensure_ascii=ascii_only) + after
    assert json_value(text) == json.loads(text)


@pytest.mark.parametrize("text", ["", "{", '{"a": 1} x', "[1,]", "nul", '"\\x"'])
def test_malformed_stored_json_says_what_json_loads_says(text: str) -> None:
    from falcon_es.domain.event_json import json_value

    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as found:
        json_value(text)
    assert str(found.value) == str(expected.value)
