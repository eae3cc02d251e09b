"""Scheduled reservation reads: what each cluster's reservation can still give.

Once per round (``falcon_es.engine.reservation_reads``: at most one per
``FALCON_RESERVATION_READ_SECONDS``) each registered cluster with a default
reservation is read for every topology its TPU type's live tasks ask for (and every
topology read before). A value that differs from the last one read is recorded as
``ReservationRead`` in the cluster's stream: the reservation-remaining gauge and
``falcon-es clusters`` take it from the log. A failed read is logged once per change
of its words and waits for the next round: no error makes these reads more frequent.

Provisioning still reads the reservation itself when a task needs a slice (its
answer must be current); these reads are for the people watching.
"""

from __future__ import annotations

import logging

from falcon_es.domain import events as ev
from falcon_es.engine.context import HandlerContext
from falcon_es.domain.ports import AWAITING, PortError
from falcon_es.domain.clusters import cluster_stream
from falcon_es.engine.runtime import Tick
from falcon_es.domain.tpu import TopologyError
from falcon_es.engine.reservation_reads import reserved_shape

log = logging.getLogger("falcon_es.handlers.reservations")


def read_reservations(tick: Tick, ctx: HandlerContext) -> None:
    reads = ctx.reservation_reads
    if reads is None or not reads.round_due(ctx.now):
        return
    asked: dict[str, set[str]] = {}
    for state in ctx.tasks.live():
        asked.setdefault(state.submission.tpu_type, set()).add(state.submission.topology)
    for cluster in ctx.clusters:
        reservation = cluster.default_reservation
        if not reservation:
            continue
        for topology in reads.topologies(cluster.id, asked.get(cluster.tpu_type, ())):
            key = (cluster.id, reservation, topology)
            try:
                shape = reserved_shape(ctx.ports.reservations, cluster, reservation, topology)
                slices = ctx.ports.reservations.remaining_slices(cluster, reservation, shape)
            except (PortError, TopologyError) as error:
                if isinstance(error, PortError) and error.code == AWAITING:
                    reads.unfinished()  # read again next tick, answered by then
                    continue
                words = error.message if isinstance(error, PortError) else str(error)
                if reads.failed(key, words):
                    log.warning("reading reservation %s of cluster %s for %s: %s; read again "
                                "in %ds", reservation, cluster.name, topology, words,
                                reads.interval.total_seconds(), extra={"cluster": cluster.name})
                continue
            if reads.read(key, slices):
                tick.emit(cluster_stream(cluster.id), ev.ReservationRead(
                    cluster.id, cluster.name, reservation, topology, slices))
