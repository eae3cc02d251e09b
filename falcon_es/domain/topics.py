"""The default names of the bus topics: edge Job/Pod observations (informers ->
controller) and the ops stream of task events.

A module of its own, because the settings (read by every command) default to them and
must not load the port protocols to do so; ``falcon_es.domain.ports`` re-exports them."""

from __future__ import annotations

EDGE_EVENTS_TOPIC = "falcon-edge-events"
TASK_EVENTS_TOPIC = "falcon-task-events"
