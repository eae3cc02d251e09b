"""Capacity ends: a flex-start node lives at most 7 days. A task
whose timeout cannot fit in that is told so at intake; a retained flex-start pool goes
only to a task that fits in its nodes' remaining life; a node that reaches its end under
a task is a disruption named as such, on the simulated world. (The hand-over rule:
``tests/handlers/test_deprovision.py``.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from falcon_es.config.settings import Settings
from falcon_es.domain.spec import SpecError, SpecLimits, parse_spec
from tests.support.harness import Harness, flex_cluster

Make = Callable[..., Harness]
DAY = 24 * 3600
TEN_DAYS = SpecLimits(max_timeout_seconds=10 * DAY)
BASE = {"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e", "topology": "2x2"}


def test_a_flex_start_timeout_longer_than_a_nodes_life_is_refused_at_intake() -> None:
    with pytest.raises(SpecError) as error:
        parse_spec({**BASE, "supply_mode": "flex-start", "timeout_seconds": 8 * DAY}, TEN_DAYS)
    assert (error.value.reason, error.value.field) == ("InvalidField", "timeout_seconds")
    assert "cannot fit in a flex-start node's life of at most 604800 s (7 days)" in str(error.value)
    assert parse_spec({**BASE, "supply_mode": "flex-start", "timeout_seconds": 7 * DAY},
                      TEN_DAYS).timeout_seconds == 7 * DAY
    assert parse_spec({**BASE, "supply_mode": "on-demand", "timeout_seconds": 8 * DAY},
                      TEN_DAYS).timeout_seconds == 8 * DAY


def test_a_flex_start_node_reaching_its_end_under_a_task_is_a_disruption(
        make: Make, db_url: str) -> None:
    """The cluster's default supply mode is flex-start, so intake cannot tell; the
    node's end kills the pod, which is recreated on a new node, and the Message names
    the end of the node's life instead of failing the task."""
    h = make(flex_cluster(), settings=Settings(db_url=db_url, max_timeout_seconds=10 * DAY))
    h.submit("t1", timeout_seconds=9 * DAY, sim={"duration_seconds": 8 * DAY})
    h.run(lambda: any(m.startswith("disrupted: ") for m in h.messages.get("t1", ())),
          max_steps=50_000, max_seconds=8 * DAY)
    ended = [m for m in h.messages["t1"] if m.startswith("disrupted: ")]
    assert ended and ("(flex-start node at the end of its life (GKE deletes flex-start nodes "
                      "after at most 7 days, their max run duration): DisruptionTarget "
                      "DeletionByPodGC: node gke-") in ended[0]
    assert "reached the end of its flex-start max run duration" in ended[0]
    assert "JobFailed" not in h.events("t1") and h.statuses()["t1"] == ("Running", None)
