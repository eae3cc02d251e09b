"""The informer of one simulated edge cluster: Job observations onto the bus, with the
faults real watch-and-relay pipelines show -- late, twice, out of order.

Late: delivered up to ``max_late_seconds`` after the change. Twice: a second copy
(same Job uid and resourceVersion, new message id) follows the first. Out of order: an
observation is held back until the Job's next observation has gone out, then sent
after it (or when the hold ends, if no next one comes).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from typing import Any

from falcon_es.domain.ports import JobObservation

from falcon_es.adapters.sim.bus import SimBus
from falcon_es.adapters.sim.common import seconds_after
from falcon_es.adapters.sim.config import DeliveryFaults
from falcon_es.adapters.sim.timeline import Timeline


class Informer:
    def __init__(self, bus: SimBus, faults: DeliveryFaults, rng: random.Random,
                 timeline: Timeline) -> None:
        self._bus = bus
        self._faults = faults
        self._rng = rng
        self._timeline = timeline
        self._held: dict[str, tuple[int, JobObservation]] = {}
        self._holds = 0
        self.delivered = 0
        self.duplicated = 0
        self.reordered = 0

    def deliver(self, observation: JobObservation, moment: dt.datetime) -> None:
        held = self._held.pop(observation.job_uid, None)
        hold = self._rng.random() < self._faults.reorder_probability
        if held is None and hold:
            self._holds += 1
            token = self._holds
            self._held[observation.job_uid] = (token, observation)
            self._timeline.at(seconds_after(moment, self._faults.reorder_max_hold_seconds),
                              self._release, observation.job_uid, token)
            return
        self._send(observation, moment)
        if held is not None:
            self.reordered += 1
            self._send(held[1], moment)

    def _release(self, job_uid: str, token: int, moment: dt.datetime) -> None:
        held = self._held.get(job_uid)
        if held is not None and held[0] == token:
            del self._held[job_uid]
            self._send(held[1], moment)

    def _send(self, observation: JobObservation, moment: dt.datetime) -> None:
        faults, rng = self._faults, self._rng
        late = rng.random() < faults.late_probability
        delay = round(rng.uniform(0, faults.max_late_seconds), 3) if late else 0.0
        twice = rng.random() < faults.duplicate_probability
        again = round(rng.uniform(0, max(faults.max_late_seconds, 1.0)), 3) if twice else 0.0
        data = observation_data(observation)
        attributes = {"cluster": observation.cluster_name, "job": observation.job_name,
                      "job_uid": observation.job_uid, "task_id": observation.task_id,
                      "resource_version": str(observation.resource_version)}
        visible_at = seconds_after(moment, delay)
        self._bus.publish_at(faults.topic, data, visible_at, ordering_key=observation.job_uid,
                             attributes=attributes, frozen=True)
        self.delivered += 1
        if twice:
            self.duplicated += 1
            self._bus.publish_at(faults.topic, data, seconds_after(visible_at, again),
                                 ordering_key=observation.job_uid, attributes=attributes,
                                 frozen=True)


def observation_data(observation: JobObservation) -> dict[str, Any]:
    """``observation.to_data()`` without ``dataclasses.asdict``'s deep copies (the
    informer publishes one per Job change; a test holds the two equal)."""
    return {
        "cluster_name": observation.cluster_name, "job_name": observation.job_name,
        "job_uid": observation.job_uid, "task_id": observation.task_id,
        "resource_version": observation.resource_version, "active": observation.active,
        "succeeded": observation.succeeded, "failed": observation.failed,
        "completions": observation.completions,
        "pods": [{"name": p.name, "phase": p.phase, "reason": p.reason,
                  "exit_code": p.exit_code, "message": p.message,
                  "finished_at": p.finished_at, "node": p.node, "disruption": p.disruption}
                 for p in observation.pods],
        "observed_at": observation.observed_at.isoformat(), "condition": observation.condition,
        "refusal": (None if observation.refusal is None
                    else dataclasses.asdict(observation.refusal)),
        "kind": observation.kind, "restarts": observation.restarts,
        "condition_reason": observation.condition_reason,
    }
