"""The sim backend assembled for a controller: the simulated world of a config (or the
one saved in the database), simulating the clusters of the controller's registry, and
the clusters a world file describes registered for the commands that bring their own
world (``demo``, ``simulate``, ``bench``).

The composition root (``falcon_es.app.bootstrap``) calls these with its application;
they read only what ``SimHost`` names of it, so this adapter never imports the layer
that builds it (as ``falcon_es.adapters.gcp.wiring`` for the gcp backend).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from sqlalchemy.engine import Engine

from falcon_es.adapters.sim.config import SimConfig, SimConfigError, load_sim_config
from falcon_es.adapters.sim.persist import SavedWorldError, WorldStore
from falcon_es.adapters.sim.world import SimWorld, behaviour_from_tasks
from falcon_es.domain.clock import Clock
from falcon_es.domain.clusters import Cluster
from falcon_es.domain.task_states import TaskStates
from falcon_es.storage import registry
from falcon_es.storage.store import EventStore

log = logging.getLogger("falcon_es.adapters.sim.wiring")
#: Where a registered cluster lives when a sim config entry does not say (demo,
#: simulate and bench register their world's clusters with these).
SIM_PROJECT, SIM_LOCATION, SIM_BUCKET = "falcon-sim", "us-central1-a", "falcon-sim-logs"


class SimWorldError(ValueError):
    """The saved world cannot be loaded (says why)."""


class SimHost(Protocol):
    """What the sim wiring reads of the application it simulates for."""

    @property
    def engine(self) -> Engine: ...

    @property
    def store(self) -> EventStore: ...

    @property
    def tasks(self) -> TaskStates: ...

    @property
    def clusters(self) -> Callable[[], Sequence[Cluster]]: ...


def sim_world(clock: Clock, config: str | Path | SimConfig | None, seed: int | None,
              host: SimHost) -> SimWorld:
    """The simulated world of ``config`` (a file, a loaded config, or None: the packaged
    default), simulating the clusters of ``host``'s registry."""
    loaded = config if isinstance(config, SimConfig) else load_sim_config(config)
    return SimWorld(clock, loaded, seed=seed, behaviour_source=behaviour_from_tasks(host.tasks),
                    registry=host.clusters)


def new_sim_world(clock: Clock, config: str | Path | SimConfig | None, seed: int | None,
                  host: SimHost) -> SimWorld:
    """A new world (``sim_world``), with a line for each cluster it describes that the
    registry lacks."""
    world = sim_world(clock, config, seed, host)
    note_unregistered(host, world)
    return world


def saved_sim_world(clock: Clock, config: str | Path | SimConfig | None, seed: int | None,
                    host: SimHost, store: WorldStore) -> SimWorld:
    """The world ``store`` saved in ``host``'s database, on ``clock`` (moved up to the
    world's moment), else a new one (``sim_world``) saved there from now on."""
    try:
        world = store.load(clock, behaviour_source=behaviour_from_tasks(host.tasks),
                           registry=host.clusters)
    except SavedWorldError as error:
        raise SimWorldError(str(error)) from error
    if world is None:
        world = new_sim_world(clock, config, seed, host)
        store.attach(world)
    else:
        log.info("going on in the simulated world saved in the database (its clock at %s, "
                 "%d cluster(s) simulated); --sim-config and --seed apply to a new world only",
                 world.now().isoformat(sep=" "), len(world.simulated()))
    return world


def continue_world(world: SimWorld, host: SimHost) -> None:
    """A later leadership term goes on in the world of the term before: the world's Jobs
    take their behaviour from this term's task states, and it simulates this term's
    view of the registry (the earlier term's app is closed)."""
    world.behaviour_source = behaviour_from_tasks(host.tasks)
    world.registry = host.clusters


def register_sim_clusters(host: SimHost, config: SimConfig) -> list[Cluster]:
    """Register the clusters ``config`` describes that the registry does not know yet,
    with the entry's project, location, TPU type, bucket and default reservation (where
    the entry leaves one out: ``SIM_PROJECT``, ``SIM_LOCATION``, ``SIM_BUCKET``). For the
    commands that bring their own world (``demo``, ``simulate``, ``bench``): a
    controller on the sim backend simulates what the registry has and registers none."""
    with host.engine.connect() as conn:
        known = {c.name for c in registry.list_clusters(conn)}
    added = []
    for entry in config.clusters:
        if entry.name in known:
            continue
        if not entry.tpu_type:
            raise SimConfigError(f"sim config {config.source}: clusters.{entry.name}: no "
                                 "tpu_type, so the cluster cannot be registered")
        added.append(registry.add_cluster(
            host.store, name=entry.name, project=entry.project or SIM_PROJECT,
            location=entry.location or SIM_LOCATION, node_location=entry.node_location,
            tpu_type=entry.tpu_type,
            gcs_bucket=entry.gcs_bucket or SIM_BUCKET,
            default_reservation=entry.default_reservation,
        ))
    return added


def note_unregistered(host: SimHost, world: SimWorld) -> None:
    """One line per cluster the sim config describes but the registry lacks: a name
    that differs by a typo would otherwise leave a cluster on the defaults unseen."""
    registered = [c.name for c in host.clusters()]
    for name in world.config.unregistered(registered):
        log.warning("sim config %s describes cluster %s, which is not registered: it is "
                    "simulated once registered (falcon-es cluster add %s ...); registered: %s",
                    world.config.source, name, name, ", ".join(registered) or "none",
                    extra={"cluster": name})
