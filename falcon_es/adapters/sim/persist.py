"""The simulated world kept beside the database, so ``run --backend sim`` killed and
started again goes on in the same world.

The world is a graph of the simulator's own objects (clusters, pools, operations,
nodes, Jobs, JobSets, pods, Services, the bus and its subscriptions, the informers,
the random streams, the timeline of what happens next). Each of them is one row,
pickled with its references to the others written as their keys, so a save writes only
the objects that changed: a pool that went RUNNING rewrites that pool, not the world.

A save runs inside the transaction of the controller's commit (``tick.write``), so the
world on disk is always the world as it stood when the log last committed: a kill
loses the calls made since, and the log does not know their outcomes either, so the
restarted controller makes them again (the same names, the same intents) as it would
after losing a real cluster's answer. Each save appends the changed rows to
``sim_world_changes``; every ``compact_every`` saves they are folded into
``sim_world_objects`` (the compacted snapshot) and dropped, so a restart reads the
world's size plus at most that many saves, whatever the length of the history.

The clock, the registry and the task states' behaviours are the controller's, not the
world's: they are wired again at load, never saved.

The saved form names no module: a row's kind and every class inside a pickle are the
stable names of ``saved_names`` (persistent ids ``("class", name)``), and references
to other world objects are persistent ids ``("ref", key)``, so moving a sim module
breaks no saved world. Worlds saved before (kinds ``module:qualname``, references
through ``reference``) still load; their next save rewrites every row by name.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import io
import logging
import pickle
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from falcon_es.storage import tables
from falcon_es.domain.clock import Clock
from falcon_es.domain.clusters import Cluster

from falcon_es.adapters.sim.kube_manifests import BehaviourSource
from falcon_es.adapters.sim.saved_names import SAVED_CLASSES, saved_names
from falcon_es.adapters.sim.world import SimWorld

log = logging.getLogger("falcon_es.adapters.sim.persist")

#: Saves between two compactions of the world's change rows (``run --sim-snapshot-every``).
DEFAULT_COMPACT_EVERY = 200
#: The world's objects: instances of the simulator's own classes, and its random streams.
SIM_PACKAGE = "falcon_es.adapters.sim."
#: The key of the world itself; the others are numbered as they are first saved.
WORLD_KEY = "world"
#: What the controller wires into a world rather than the world keeps.
CLOCK, REGISTRY, BEHAVIOUR = "ext:clock", "ext:registry", "ext:behaviour"
#: Rows per INSERT.
CHUNK = 500
#: A row's kind: this prefix and the class's saved name (``saved_names``). A kind
#: without it is a ``module:qualname`` of a world saved before names.
NAMED = "named:"
#: Values pickled as they are, never a world object nor a class: the bulk of a world's
#: attributes, let through without a look.
PLAIN = frozenset({str, int, float, bool, type(None), bytes, tuple, list, dict, set,
                   dt.datetime})


def _is_object_type(cls: type) -> bool:
    """Its instances get a row of their own: the simulator's classes (not its enums,
    nor classes whose instances keep no ``__dict__``), and random streams (two objects
    may share one, so it cannot be copied into each)."""
    return cls is random.Random or (cls.__module__.startswith(SIM_PACKAGE)
                                    and not issubclass(cls, enum.Enum)
                                    and "__slots__" not in vars(cls))


def _is_frozen(value: object) -> bool:
    """A frozen dataclass never changes: written once, never pickled again."""
    params = getattr(type(value), "__dataclass_params__", None)
    return bool(params is not None and params.frozen)


#: Attribute values an object can be compared by without pickling it.
SCALARS = frozenset({str, int, float, bool, type(None), dt.datetime})


def _fingerprint(obj: object) -> tuple[object, ...] | None:
    """The attribute values of an object that holds scalars only (a pod, a node, an
    operation): equal to the last save's, the object is unchanged. None: it holds
    more and is pickled to tell."""
    if isinstance(obj, random.Random):
        return None
    values = tuple(obj.__dict__.values())
    return values if all(type(v) in SCALARS for v in values) else None


def read_only(items: dict[Any, Any]) -> MappingProxyType[Any, Any]:
    """A read-only mapping again, in worlds saved before names (those name it)."""
    return MappingProxyType(items)


def reference(key: str) -> object:
    """Stood for another world object in worlds saved before names; the loader
    resolves it."""
    raise RuntimeError(f"world object {key} read outside WorldStore.load")


#: What worlds saved before names referred to in this module, by name (wherever the
#: module lives now).
_OLD_MARKERS = frozenset({reference.__name__, read_only.__name__})


def _state(obj: object) -> object:
    """What a row holds of an object: a random stream's state, else its attributes."""
    return obj.getstate() if isinstance(obj, random.Random) else obj.__dict__


class _Pickler(pickle.Pickler):
    """Pickles one object's state; every world object it refers to becomes a key, and
    every class of ours its saved name (persistent ids, so no module path is written).
    """

    def __init__(self, out: io.BytesIO, key_of: Callable[[object], str | None],
                 refs: list[object], names: Mapping[type, str]) -> None:
        super().__init__(out, protocol=pickle.HIGHEST_PROTOCOL)
        self._key_of = key_of
        self._refs = refs
        self._names = names

    def persistent_id(self, obj: object) -> tuple[str, str] | None:
        """``("ref", key)`` for a world object, ``("class", name)`` for a class that
        has a saved name; None (pickled as it is) for anything else."""
        kind = type(obj)
        if kind in PLAIN:
            return None
        if kind is type or isinstance(obj, type):
            return _class_id(obj, self._names)  # type: ignore[arg-type]
        key = self._key_of(obj)
        if key is None:
            return None
        self._refs.append(obj)
        return ("ref", key)

    def reducer_override(self, obj: object) -> Any:
        """A read-only mapping as a plain one made read-only again (pickle cannot name
        ``MappingProxyType`` itself; its saved name stands for it)."""
        if type(obj) is MappingProxyType:
            return MappingProxyType, (dict(obj),)  # type: ignore[arg-type]
        return NotImplemented


def _class_id(cls: type, names: Mapping[type, str]) -> tuple[str, str] | None:
    """The class's saved name; None: pickled by its module path (the standard
    library's classes, and one of ours that was not named, which is logged: the save
    goes on, and the world depends on that path until the class is named)."""
    name = names.get(cls)
    if name is not None:
        return ("class", name)
    if cls.__module__.startswith("falcon_es."):
        log.warning("the simulated world holds a %s (%s), which has no saved name: it is "
                    "saved by module path; add it to falcon_es.adapters.sim.saved_names",
                    cls.__qualname__, cls.__module__)
    return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, resolve: Callable[[str], object]) -> None:
        super().__init__(io.BytesIO(data))
        self._resolve = resolve

    def persistent_load(self, pid: Any) -> object:
        """A reference resolves to the loaded world's object of that key, a class
        name to the class saved under it."""
        kind, name = pid
        if kind == "ref":
            return self._resolve(name)
        if kind == "class":
            return _named_class(name)
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")

    def find_class(self, module: str, name: str) -> Any:
        """In a world saved before names: a reference, and classes by module path
        (by their name when the module has moved since)."""
        if module.rpartition(".")[2] == "persist" and name in _OLD_MARKERS:
            return self._resolve if name == reference.__name__ else read_only
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            if not module.startswith("falcon_es."):
                raise
            return _class_by_qualname(name)


class SavedWorldError(Exception):
    """The database holds a world this version of the simulator cannot read."""


class WorldStore:
    """One named world in the database: ``load`` it (None when none was saved), then
    ``save`` it on each commit's connection."""

    def __init__(self, engine: Engine, name: str = "default", *,
                 compact_every: int = DEFAULT_COMPACT_EVERY) -> None:
        if compact_every < 1:
            raise ValueError(f"compact_every must be at least 1, not {compact_every}")
        self.engine = engine
        self.name = name
        self.compact_every = compact_every
        #: id(object) -> (key, object): the object is held so its id is not reused.
        self._keys: dict[int, tuple[str, object]] = {}
        #: key -> (class path, pickled bytes) as the database holds it now.
        self._written: dict[str, tuple[str, bytes]] = {}
        #: key -> the objects a frozen object refers to (it is not pickled again).
        self._refs: dict[str, list[object]] = {}
        #: key -> the attribute values of a scalars-only object at the last save.
        self._prints: dict[str, tuple[object, ...]] = {}
        #: Whether a type's instances are world objects (asked once per type).
        self._object_types: dict[type, bool] = {}
        self._names = saved_names()
        self._next_key = 1
        self._seq = 0
        self._snapshot_seq = 0
        self.world: SimWorld | None = None

    # ------------------------------------------------------------------ load

    def load(self, clock: Clock, *, behaviour_source: BehaviourSource | None = None,
             registry: Callable[[], Sequence[Cluster]] | None = None) -> SimWorld | None:
        """The saved world, on ``clock`` (moved up to the world's moment when behind
        it), or None when this database holds none."""
        with self.engine.connect() as conn:
            head = conn.execute(sa.select(tables.sim_worlds).where(
                tables.sim_worlds.c.name == self.name)).first()
            if head is None:
                return None
            rows: dict[str, tuple[str, bytes]] = {
                r.key: (r.kind, r.blob) for r in conn.execute(
                    sa.select(tables.sim_world_objects).where(
                        tables.sim_world_objects.c.world == self.name))}
            for r in conn.execute(sa.select(tables.sim_world_changes).where(
                    tables.sim_world_changes.c.world == self.name).order_by(
                    tables.sim_world_changes.c.seq)):
                if r.blob is None:
                    rows.pop(r.key, None)
                else:
                    rows[r.key] = (r.kind, r.blob)
        externals: dict[str, object] = {CLOCK: clock, REGISTRY: registry,
                                        BEHAVIOUR: behaviour_source}
        try:
            shells = {key: _shell(kind) for key, (kind, _) in rows.items()}

            def resolve(key: str) -> object:
                if key in externals:
                    return externals[key]
                if key not in shells:
                    raise LookupError(f"object {key} is missing")
                return shells[key]

            for key, (_, blob) in rows.items():
                _fill(shells[key], _Unpickler(blob, resolve).load())
            world = shells.get(WORLD_KEY)
            if not isinstance(world, SimWorld):
                raise LookupError("it has no world object")
        except (AttributeError, ImportError, LookupError, TypeError, ValueError,
                pickle.UnpicklingError) as error:
            raise SavedWorldError(
                f"the simulated world saved in the database ({self.name!r}) cannot be "
                f"loaded: {error}; it was saved by another version of the simulator. Go on "
                "with a fresh database, or with --sim-snapshot-every 0 (a world in this "
                "process only)") from error
        world.clock, world.registry, world.behaviour_source = clock, registry, behaviour_source
        advance_to = getattr(clock, "advance_to", None)
        if advance_to is not None:
            advance_to(head.moment)
        self._written = rows
        self._keys = {id(obj): (key, obj) for key, obj in shells.items()}
        self._next_key = 1 + max((int(k) for k in rows if k.isdigit()), default=0)
        self._seq, self._snapshot_seq = head.seq, head.snapshot_seq
        self.world = world
        return world

    # ------------------------------------------------------------------ save

    def attach(self, world: SimWorld) -> None:
        """Save this (new) world from now on."""
        self.world = world
        self._keys = {id(world): (WORLD_KEY, world)}

    def save(self, conn: Connection) -> None:
        """Write what changed in the world since the last save, on ``conn`` (the
        commit's transaction): changed rows, then, every ``compact_every`` saves, the
        compacted snapshot."""
        world = self.world
        if world is None:
            raise RuntimeError("WorldStore.save before load or attach")
        current = self._pickle_all(world)
        changes: list[tuple[str, str, bytes | None]] = [
            (k, kind, blob) for k, (kind, blob) in current.items()
            if self._written.get(k) != (kind, blob)]
        changes += [(k, "", None) for k in self._written if k not in current]
        self._seq += 1
        moment = world.now()
        if self._seq - self._snapshot_seq >= self.compact_every:
            self._compact(conn, current)
        else:
            _insert(conn, tables.sim_world_changes, [
                {"world": self.name, "seq": self._seq, "key": k, "kind": kind, "blob": blob}
                for k, kind, blob in changes])
        head = {"seq": self._seq, "snapshot_seq": self._snapshot_seq, "moment": moment,
                "objects": len(current)}
        updated = conn.execute(tables.sim_worlds.update().where(
            tables.sim_worlds.c.name == self.name).values(**head)).rowcount
        if not updated:
            conn.execute(tables.sim_worlds.insert().values(name=self.name, **head))
        self._written = current
        self._keys = {i: entry for i, entry in self._keys.items() if entry[0] in current}
        self._refs = {k: refs for k, refs in self._refs.items() if k in current}
        self._prints = {k: values for k, values in self._prints.items() if k in current}

    def _compact(self, conn: Connection, current: Mapping[str, tuple[str, bytes]]) -> None:
        """The whole world as the snapshot; the change rows before it go."""
        conn.execute(tables.sim_world_changes.delete().where(
            tables.sim_world_changes.c.world == self.name))
        conn.execute(tables.sim_world_objects.delete().where(
            tables.sim_world_objects.c.world == self.name))
        _insert(conn, tables.sim_world_objects, [
            {"world": self.name, "key": k, "kind": kind, "blob": blob}
            for k, (kind, blob) in current.items()])
        self._snapshot_seq = self._seq

    def _pickler(self, out: io.BytesIO, key_of: Callable[[object], str | None],
                 refs: list[object]) -> pickle.Pickler:
        return _Pickler(out, key_of, refs, self._names)

    def _kind(self, cls: type) -> str:
        """A row's kind: its class's saved name (its module path, as worlds saved
        before names have it, for a class not named)."""
        found = _class_id(cls, self._names)
        return f"{cls.__module__}:{cls.__qualname__}" if found is None else NAMED + found[1]

    def _pickle_all(self, world: SimWorld) -> dict[str, tuple[str, bytes]]:
        """Every object reachable from the world, by key, pickled (a frozen one that
        was written already keeps its bytes)."""
        externals = {id(world.clock): CLOCK}
        if world.registry is not None:
            externals[id(world.registry)] = REGISTRY
        if world.behaviour_source is not None:
            externals[id(world.behaviour_source)] = BEHAVIOUR
        out: dict[str, tuple[str, bytes]] = {}
        pending: list[tuple[str, object]] = [(WORLD_KEY, world)]
        queued = {WORLD_KEY}

        def key_of(obj: object) -> str | None:
            external = externals.get(id(obj))
            if external is not None:
                return external
            is_object = self._object_types.get(type(obj))
            if is_object is None:
                is_object = self._object_types[type(obj)] = _is_object_type(type(obj))
            if not is_object:
                return None
            entry = self._keys.get(id(obj))
            if entry is None:
                entry = self._keys[id(obj)] = (str(self._next_key), obj)
                self._next_key += 1
            if entry[0] not in queued:
                queued.add(entry[0])
                pending.append(entry)
            return entry[0]

        buffer, refs = io.BytesIO(), list[object]()
        pickler = self._pickler(buffer, key_of, refs)
        while pending:
            key, obj = pending.pop()
            frozen = _is_frozen(obj)
            if frozen and key in self._written and key in self._refs:
                out[key] = self._written[key]
                for ref in self._refs[key]:
                    key_of(ref)
                continue
            values = None if frozen else _fingerprint(obj)
            if values is not None and key in self._written and self._prints.get(key) == values:
                out[key] = self._written[key]
                continue
            pickler.clear_memo()
            buffer.seek(0)
            buffer.truncate()
            refs.clear()
            pickler.dump(_state(obj))
            out[key] = (self._kind(type(obj)), buffer.getvalue())
            if frozen:
                self._refs[key] = list(refs)
            if values is not None:
                self._prints[key] = values
        return out


def _shell(kind: str) -> object:
    """An empty object of the saved class, filled once every object exists (they refer
    to each other in cycles)."""
    cls: Any = _named_class(kind[len(NAMED):]) if kind.startswith(NAMED) else _old_kind(kind)
    return cls.__new__(cls)


def _named_class(name: str) -> type:
    cls = SAVED_CLASSES.get(name)
    if cls is None:
        raise LookupError(f"no class is saved as {name!r}")
    return cls


def _old_kind(kind: str) -> type:
    """The class of a row saved before names (``module:qualname``): where the module
    still has it, else the saved class of that name."""
    module, _, qualname = kind.partition(":")
    try:
        cls: Any = __import__(module, fromlist=["_"])
        for part in qualname.split("."):
            cls = getattr(cls, part)
    except (ImportError, AttributeError):
        return _class_by_qualname(qualname)
    return cls  # type: ignore[no-any-return]


def _class_by_qualname(qualname: str) -> type:
    for cls in SAVED_CLASSES.values():
        if cls.__qualname__ == qualname:
            return cls
    raise LookupError(f"no class {qualname!r} is known to this version")


def _fill(shell: object, state: Any) -> None:
    if isinstance(shell, random.Random):
        shell.setstate(state)
        return
    if dataclasses.is_dataclass(shell):
        state = {**_added_since(type(shell), state), **state}
        _check_shape(type(shell), state)
    shell.__dict__.update(state)


def _added_since(cls: type, state: Mapping[str, object]) -> dict[str, object]:
    """The defaults of fields only added to the class since the save (each with a plain
    default, none of the saved ones gone: not a rename): a world saved before them
    loads with them as a fresh object would have them."""
    fields = dataclasses.fields(cls)
    if set(state) - {f.name for f in fields}:
        return {}
    return {f.name: f.default for f in fields
            if f.name not in state and f.default is not dataclasses.MISSING}


def _check_shape(cls: type, state: Mapping[str, object]) -> None:
    """A saved dataclass must have the fields its class has now: a field renamed or
    dropped since the save would otherwise load as a stale attribute beside a missing
    one, and the world would go on silently wrong (or fail later, mid-run). A field
    added since with a plain default is filled in before (``_added_since``)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    gone, new = sorted(set(state) - fields), sorted(fields - set(state))
    if gone or new:
        raise ValueError(f"a saved {cls.__qualname__} has the fields {gone} this version has "
                         f"not, and lacks {new}")


def _insert(conn: Connection, table: sa.Table, rows: Iterable[Mapping[str, object]]) -> None:
    batch = list(rows)
    for first in range(0, len(batch), CHUNK):
        conn.execute(table.insert(), batch[first:first + CHUNK])


def saved_moment(engine: Engine, name: str = "default") -> dt.datetime | None:
    """When the saved world was last saved (its own clock), or None."""
    with engine.connect() as conn:
        return conn.execute(sa.select(tables.sim_worlds.c.moment).where(
            tables.sim_worlds.c.name == name)).scalar()
