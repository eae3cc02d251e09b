"""The cluster autoscaler's word on a pending pod, as the gcp diagnosis reads it
(``kube_diagnosis.autoscaler_cause``): while it backs off after a failed scale-up its
newest event is a Normal NotTriggerScaleUp "pod didn't trigger scale-up: 1 in backoff
after failed scale-up" (kubernetes/autoscaler ``skippedreasons.go``), which says no
cause of its own: the last FailedScaleUp does."""

from __future__ import annotations

import datetime as dt

from kubernetes import client

from falcon_es.adapters.gcp.kube_diagnosis import autoscaler_cause

AT = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
STOCKOUT = ("Node scale up in zones us-east5-b associated with this pod failed: GCE out of "
            "resources. Pod is at risk of not being scheduled.")
BACKOFF = "pod didn't trigger scale-up: 1 in backoff after failed scale-up"


def event(reason: str, message: str, minute: int) -> client.CoreV1Event:
    return client.CoreV1Event(
        metadata=client.V1ObjectMeta(name=f"e{minute}"), reason=reason, message=message,
        involved_object=client.V1ObjectReference(kind="Pod", name="p"),
        last_timestamp=AT + dt.timedelta(minutes=minute))


def test_the_backoff_note_gives_way_to_the_failed_scale_up_before_it() -> None:
    found = autoscaler_cause([event("FailedScaleUp", STOCKOUT, 1),
                              event("NotTriggerScaleUp", BACKOFF, 2)])
    assert found is not None and (found.reason, found.message) == ("FailedScaleUp", STOCKOUT)


def test_any_other_newest_word_is_the_cause() -> None:
    misfit = "pod didn't trigger scale-up (it wouldn't fit if a new node is added): 1 Insufficient memory"
    found = autoscaler_cause([event("FailedScaleUp", STOCKOUT, 1),
                              event("NotTriggerScaleUp", misfit, 2)])
    assert found is not None and found.message == misfit
    alone = autoscaler_cause([event("NotTriggerScaleUp", BACKOFF, 2)])
    assert alone is not None and alone.message == BACKOFF  # no cause seen: say what there is
    assert autoscaler_cause([event("Scheduled", "ok", 1)]) is None
