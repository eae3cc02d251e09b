"""The simulated world kept beside the database (``falcon_es.adapters.sim.persist``).

A world saved and loaded again at any moment goes on exactly as the world that was
never saved: the same pools at the same moments, the same observations delivered in
the same order, with the same random draws (stockouts, delivery faults) after the
load as before it. A timeline entry that could not be written down is refused when it
is scheduled. A world saved with objects of another shape (a field renamed since) fails
the load with one line naming the fields. The world keeps its own record of the creates it
accepted. Only the rows that changed are written per save, and the change rows are
compacted so a load reads at most ``compact_every`` saves besides the snapshot.
"""

from __future__ import annotations

import datetime as dt
import pickle
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import sqlalchemy as sa

from falcon_es.storage import db, tables
from falcon_es.adapters.sim import SimConfig, SimWorld, build_sim_ports
from falcon_es.adapters.sim import persist
from falcon_es.adapters.sim.persist import SavedWorldError, WorldStore
from falcon_es.adapters.sim.timeline import Timeline
from falcon_es.domain.clock import VirtualClock
from falcon_es.domain.ports import ALREADY_EXISTS, JobObservation, PortError
from tests.conftest import migrate
from tests.test_sim_world import BASE, START, Sim, job, merged

#: Stockouts, quota refusals and every delivery fault: random draws all through the run.
FAULTY = merged(BASE, {
    "defaults": {"stockout": {"probability": 0.5, "duration_seconds": [30, 400]},
                 "quota": {"probability": 0.3, "failure_after_seconds": 15}},
    "delivery": {"late_probability": 0.3, "max_late_seconds": 20,
                 "duplicate_probability": 0.3, "reorder_probability": 0.3,
                 "reorder_max_hold_seconds": 40},
})


def scenario(sim: Sim, between: Callable[[Sim], None]) -> list[JobObservation]:
    """Pools and Jobs on two clusters, time moving in uneven steps; ``between`` runs
    after every step (a save and load, or nothing)."""
    seen: list[JobObservation] = []
    outcomes = ["succeed", "fail", "oom", "succeed", "image-pull-error", "succeed"]
    for i, outcome in enumerate(outcomes):
        pool = f"falcon-p{i}"
        if i % 2:
            sim.create(sim.flex, pool, "2x2x1", "flex-start")
        else:
            sim.create(sim.east, pool, "2x2", "reservation", "res-a")
        between(sim)
        sim.at((sim.clock.now() - START).total_seconds() + 37 * (i + 1))
        seen += sim.drain()
        between(sim)
    for step in range(40):
        for i, outcome in enumerate(outcomes):
            c = sim.flex if i % 2 else sim.east
            pool = sim.world.pool(c.name, f"falcon-p{i}")
            name = f"job-{i}"
            if (pool is not None and pool.status == "RUNNING"
                    and sim.world.job_state(c.name, name) is None and step < 20):
                sim.edge(c).submit_job(job(name, f"falcon-p{i}", task=f"t{i}",
                                           sim={"outcome": outcome, "duration_seconds": 90}))
        sim.at((sim.clock.now() - START).total_seconds() + 13 + step % 7)
        seen += sim.drain()
        between(sim)
        if step == 30:
            for i in range(len(outcomes)):
                sim.ports.node_pools.delete(sim.flex if i % 2 else sim.east, f"falcon-p{i}")
    return seen


def reload_through(engine: sa.engine.Engine, compact_every: int) -> Callable[[Sim], None]:
    """Save the world, then replace it by what a new process would load."""
    store = WorldStore(engine, compact_every=compact_every)

    def between(sim: Sim) -> None:
        if store.world is None:
            store.attach(sim.world)
        with engine.begin() as conn:
            store.save(conn)
        clock = VirtualClock(START)
        loaded = WorldStore(engine, compact_every=compact_every).load(clock)
        assert loaded is not None and loaded is not sim.world
        sim.clock, sim.world, sim.ports = clock, loaded, build_sim_ports(loaded)
        store.attach(loaded)

    return between


def picture(sim: Sim) -> dict[str, Any]:
    world = sim.world
    return {"pools": world.pools(include_deleted=True), "now": world.now(),
            "next_due": world.next_due(), "delivery": world.delivery_stats(),
            "creates": dict(world.creates.counts),
            "jobs": {(c, f"job-{i}"): world.job_state(c, f"job-{i}")
                     for c in ("east", "flex") for i in range(6)}}


@pytest.fixture
def engine(tmp_path: Path) -> sa.engine.Engine:
    url = f"sqlite:///{tmp_path / 'world.db'}"
    migrate(url)
    return db.make_engine(url)


@pytest.mark.parametrize("compact_every", [1, 3, 1000])
def test_a_world_saved_and_loaded_at_every_step_goes_on_as_one_never_saved(
        engine: sa.engine.Engine, compact_every: int) -> None:
    kept = Sim(FAULTY, seed=5)
    kept_seen = scenario(kept, lambda sim: None)
    reloaded = Sim(FAULTY, seed=5)
    reloaded_seen = scenario(reloaded, reload_through(engine, compact_every))
    assert reloaded.world is not kept.world
    assert reloaded_seen == kept_seen
    assert picture(reloaded) == picture(kept)
    assert {p.status for p in picture(kept)["pools"]} == {"DELETED"}
    conditions = {o.condition for o in kept_seen}
    assert {"Complete", "Failed"} <= conditions, "Jobs ran to both ends"
    assert kept.world.delivery_stats()["duplicated"] > 0


def test_only_changed_objects_are_written_and_changes_are_compacted(engine: sa.engine.Engine) -> None:
    sim = Sim(BASE)
    store = WorldStore(engine, compact_every=4)
    store.attach(sim.world)

    def save() -> int:
        with engine.begin() as conn:
            store.save(conn)
            return conn.execute(sa.select(sa.func.count()).select_from(
                tables.sim_world_changes)).scalar_one()

    sim.create(sim.east, "falcon-a", "2x2", "reservation", "res-a")
    first = save()
    assert save() == first, "nothing changed: no row written"
    sim.at(70)  # the pool's nodes register: that pool, its cluster's services, the timeline
    third = save()
    assert 0 < third - first < first
    assert save() == 0, "the fourth save compacts every change into the snapshot"
    with engine.connect() as conn:
        head = conn.execute(sa.select(tables.sim_worlds)).one()
        objects = conn.execute(sa.select(sa.func.count()).select_from(
            tables.sim_world_objects)).scalar_one()
    assert (head.seq, head.snapshot_seq, head.objects) == (4, 4, objects)
    assert head.moment == START + dt.timedelta(seconds=70)
    clock = VirtualClock(START)
    loaded = WorldStore(engine).load(clock)
    assert loaded is not None and clock.now() == head.moment, "the clock goes on from the world's"
    assert loaded.pool("east", "falcon-a") == sim.world.pool("east", "falcon-a")


def test_the_world_records_each_create_it_accepted_and_not_a_refused_one() -> None:
    sim = Sim(BASE)
    sim.create(sim.east, "falcon-a", "2x2", "reservation", "res-a")
    with pytest.raises(PortError) as refused:
        sim.create(sim.east, "falcon-a", "2x2", "reservation", "res-a")
    assert refused.value.code == ALREADY_EXISTS
    sim.at(75)
    sim.edge(sim.east).submit_job(job("job-a", "falcon-a"))
    with pytest.raises(PortError):
        sim.edge(sim.east).submit_job(job("job-a", "falcon-a"))
    assert dict(sim.world.creates.counts) == {"east/NodePool/falcon-a": 1, "east/Job/job-a": 1}


def test_a_world_this_version_cannot_read_fails_the_load_naming_why(
        engine: sa.engine.Engine) -> None:
    sim = Sim(BASE)
    sim.create(sim.east, "falcon-a", "2x2", "reservation", "res-a")
    store = WorldStore(engine)
    store.attach(sim.world)
    with engine.begin() as conn:
        store.save(conn)
        conn.execute(tables.sim_world_changes.update().where(
            tables.sim_world_changes.c.kind.like("%:SimPool")).values(
            kind="falcon_es.adapters.sim.gke:RenamedPool"))
    with pytest.raises(SavedWorldError, match="cannot be loaded: .*RenamedPool.*another version"):
        WorldStore(engine).load(VirtualClock(START))


def test_a_saved_object_whose_fields_this_version_renamed_fails_the_load_naming_them(
        engine: sa.engine.Engine) -> None:
    """A Job saved when its FailedCreate was kept under another field name: loaded as it
    is, it would carry the stale field and lack the current one."""
    sim = Sim(BASE)
    sim.create(sim.east, "falcon-a", "2x2", "reservation", "res-a")
    sim.edge(sim.east).submit_job(job("job-a", "falcon-a"))
    saved = sim.world.cluster(sim.east).kube.jobs["job-a"].__dict__
    del saved["refused"]
    saved["followers_refusal"] = None
    store = WorldStore(engine)
    store.attach(sim.world)
    with engine.begin() as conn:
        store.save(conn)
    with pytest.raises(SavedWorldError, match=r"cannot be loaded: a saved SimJob has the fields "
                                              r"\['followers_refusal'\] this version has not, "
                                              r"and lacks \['refused'\].*another version"):
        WorldStore(engine).load(VirtualClock(START))


def test_no_saved_world_loads_as_none(engine: sa.engine.Engine) -> None:
    assert WorldStore(engine).load(VirtualClock(START)) is None


def test_a_timeline_entry_must_be_a_method_of_a_world_object() -> None:
    timeline = Timeline()
    world = SimWorld(VirtualClock(START), SimConfig.from_data(BASE))
    with pytest.raises(TypeError, match="method of a world object"):
        timeline.at(START, lambda moment: None)
    with pytest.raises(TypeError, match="method of a world object"):
        timeline.at(START, SimWorld.step, world)
    timeline.at(START, world.step)
    assert timeline.play_due(START) == START


# --- The saved form names no module ------------------------------------------------


def _saved_scenario(engine: sa.engine.Engine, store: WorldStore) -> Sim:
    """Two saves of a world with a pool, a Job and its observations in flight."""
    sim = Sim(FAULTY, seed=5)
    store.attach(sim.world)
    sim.create(sim.east, "falcon-a", "2x2", "reservation", "res-a")
    sim.at(75)
    with engine.begin() as conn:
        store.save(conn)
    sim.edge(sim.east).submit_job(job("job-a", "falcon-a", task="ta"))
    sim.at(200)
    with engine.begin() as conn:
        store.save(conn)
    return sim


def _goes_on_alike(engine: sa.engine.Engine, sim: Sim) -> None:
    clock = VirtualClock(START)
    loaded = WorldStore(engine).load(clock)
    assert loaded is not None
    assert loaded.pools(include_deleted=True) == sim.world.pools(include_deleted=True)
    again = Sim(FAULTY, seed=5)
    again.clock, again.world, again.ports = clock, loaded, build_sim_ports(loaded)
    for step in (260, 400):
        sim.at(step)
        again.at(step)
        assert again.drain() == sim.drain()


def test_a_saved_world_loads_after_its_classes_moved_to_other_modules(
        engine: sa.engine.Engine, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Rows and pickles name classes by their saved names: a sim class and a domain
    value the world holds moved to modules that did not exist at the save, and gone
    from their old ones, the world loads and goes on."""
    from falcon_es.adapters.sim import gke, saved_names
    from falcon_es.domain import ports

    sim = _saved_scenario(engine, WorldStore(engine))
    for module, cls in ((gke, saved_names.SAVED_CLASSES["SimPool"]),
                        (ports, saved_names.SAVED_CLASSES["JobObservation"])):
        monkeypatch.delattr(module, cls.__name__)
        monkeypatch.setattr(cls, "__module__", "falcon_es.adapters.sim.moved_away")
    with engine.connect() as conn:
        blobs = [r.kind.encode() + r.blob for r in conn.execute(
            sa.select(tables.sim_world_changes))]
    assert blobs and not any(b"falcon_es" in blob for blob in blobs), "no module path saved"
    assert "no saved name" not in caplog.text
    _goes_on_alike(engine, sim)


class _BeforeNames(WorldStore):
    """Saves as the store did before saved names: kinds ``module:qualname``, classes
    by module path, references through ``persist.reference``."""

    def _kind(self, cls: type) -> str:
        return f"{cls.__module__}:{cls.__qualname__}"

    def _pickler(self, out: Any, key_of: Callable[[object], str | None],
                 refs: list[object]) -> pickle.Pickler:
        return _PathPickler(out, key_of, refs)


class _PathPickler(pickle.Pickler):
    def __init__(self, out: Any, key_of: Callable[[object], str | None],
                 refs: list[object]) -> None:
        super().__init__(out, protocol=pickle.HIGHEST_PROTOCOL)
        self._key_of, self._refs = key_of, refs

    def reducer_override(self, obj: object) -> Any:
        if type(obj) is MappingProxyType:
            return persist.read_only, (dict(obj),)
        key = self._key_of(obj)
        if key is None:
            return NotImplemented
        self._refs.append(obj)
        return persist.reference, (key,)


def test_a_world_saved_before_names_still_loads_and_is_saved_by_name_next(
        engine: sa.engine.Engine) -> None:
    sim = _saved_scenario(engine, _BeforeNames(engine))
    with engine.connect() as conn:
        kinds = {r.kind for r in conn.execute(sa.select(tables.sim_world_changes))}
    assert "falcon_es.adapters.sim.gke:SimPool" in kinds
    _goes_on_alike(engine, sim)
    store = WorldStore(engine, compact_every=1)
    loaded = store.load(VirtualClock(START))
    assert loaded is not None
    with engine.begin() as conn:
        store.save(conn)
    with engine.connect() as conn:
        kinds = {r.kind for r in conn.execute(sa.select(tables.sim_world_objects))}
    assert "named:SimPool" in kinds and not any(k.startswith("falcon_es") for k in kinds)


def test_every_class_of_the_simulator_has_a_saved_name_or_is_never_saved() -> None:
    """A class of the world without a saved name would fail the save that first meets
    one of its objects: named here instead, when it is added."""
    import importlib
    import inspect
    import pkgutil

    from falcon_es.adapters import sim as sim_package
    from falcon_es.adapters.sim.saved_names import SAVED_CLASSES

    never_saved = {"WorldCall", "JobSetHost", "SimConfigError", "SavedWorldError", "_Parser",
                   "_Pickler", "_Unpickler", "WorldStore", "SimWorldError", "SimHost",
                   "SimLogFiles"}  # built by falcon-es logs over a loaded world
    named = set(SAVED_CLASSES.values())
    missing = []
    for info in pkgutil.iter_modules(sim_package.__path__):
        module = importlib.import_module(f"{sim_package.__name__}.{info.name}")
        for cls in vars(module).values():
            if (inspect.isclass(cls) and cls.__module__ == module.__name__
                    and cls not in named and cls.__qualname__ not in never_saved):
                missing.append(f"{module.__name__}.{cls.__qualname__}")
    assert missing == []
    assert len(set(SAVED_CLASSES.values())) == len(SAVED_CLASSES), "one name per class"


def test_every_value_class_the_simulator_takes_from_elsewhere_has_a_saved_name() -> None:
    """The domain's values a sim module uses (a create refusal, a Job reference) may
    sit in the world: named, or known never to be saved (ports, protocols, errors)."""
    import importlib
    import inspect
    import pkgutil

    from falcon_es.adapters import sim as sim_package
    from falcon_es.adapters.sim.saved_names import SAVED_CLASSES

    never_saved = {"Clock", "EventStore", "PortError", "Ports", "TaskStates", "LogObject"}
    named = set(SAVED_CLASSES.values())
    missing = set()
    for info in pkgutil.iter_modules(sim_package.__path__):
        module = importlib.import_module(f"{sim_package.__name__}.{info.name}")
        for cls in vars(module).values():
            if (inspect.isclass(cls) and cls.__module__.startswith("falcon_es.")
                    and not cls.__module__.startswith(sim_package.__name__)
                    and cls not in named and cls.__qualname__ not in never_saved):
                missing.add(f"{cls.__module__}.{cls.__qualname__}")
    assert missing == set()


def test_a_saved_object_without_a_field_added_since_loads_with_its_default(
        engine: sa.engine.Engine) -> None:
    """A world saved before a field with a plain default was added (a JobSet's
    JobCreationFailed) goes on, the field as a fresh object has it."""
    sim = Sim(BASE)
    sim.create(sim.east, "falcon-a", "2x2", "reservation", "res-a")
    sim.edge(sim.east).submit_job(job("job-a", "falcon-a"))
    saved = sim.world.cluster(sim.east).kube.jobs["job-a"].__dict__
    del saved["refused"]
    store = WorldStore(engine)
    store.attach(sim.world)
    with engine.begin() as conn:
        store.save(conn)
    loaded = WorldStore(engine).load(VirtualClock(START))
    assert loaded is not None
    assert loaded.cluster(sim.east).kube.jobs["job-a"].refused is None
