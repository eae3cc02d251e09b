"""The JobSet controller's own refusals on the simulated world: a multi-slice task
whose child Jobs the namespace's ResourceQuota refuses leads its Message and
``explain`` with the controller's ``JobCreationFailed`` in its own words, waits the
refusal grace out and then fails naming it; a single-slice task's own Job create is
refused in the quota plugin's words at once."""

from __future__ import annotations

from falcon_es.projections.explain import Node, explain
from tests.support.harness import Harness, Harnesses, reserved_cluster

QUOTA = ('jobs.batch "{job}" is forbidden: exceeded quota: falcon-jobs, requested: '
         "count/jobs.batch=1, used: count/jobs.batch=0, limited: count/jobs.batch=0")
#: The controller's words: each child's error, joined by newlines (``createJobs``).
WORDS = "\n".join(f'job "falcon-t1-slice-{i}" creation failed with error: '
                  + QUOTA.format(job=f"falcon-t1-slice-{i}") for i in (0, 1))
CAUSE = f"JobSet controller JobCreationFailed: {WORDS}"


def _links(h: Harness, task_id: str, lang: str = "en") -> list[Node]:
    node = explain(task_id, h.app.store.read_stream(task_id), lang=lang)
    links = [node]
    while links[-1].children:
        links.append(links[-1].children[0])
    return links


def test_a_jobset_whose_jobs_are_refused_leads_with_the_controllers_words(
        make: Harnesses) -> None:
    h = make(reserved_cluster(count=16))
    h.submit("t1", topology="4x4", slices=2, sim={"outcome": "jobs-refused"})
    h.run(until=lambda: "JobCreationFailed" in (h.row("t1")["message"] or ""))
    assert h.statuses()["t1"] == ("Pending", "Dispatching")
    assert h.row("t1")["message"] == f"{CAUSE}; JobSet falcon-t1 cannot create its Jobs"
    links = _links(h, "t1")
    assert [link.text for link in links] == [
        CAUSE, "JobSet falcon-t1 cannot create its Jobs", "task is Pending/Dispatching"]
    assert links[0].source == ("edge: JobCreationFailed on JobSet falcon-t1 "
                               "(JobSet controller)")
    assert _links(h, "t1", "zh")[1].text == "JobSet falcon-t1 无法创建其 Job"
    assert h.world.cluster("v6e-res").kube.jobsets.diagnose("falcon-t1") == CAUSE
    # The controller keeps trying in the same words: one PodsRefused, not one a try.
    h.run()
    assert h.statuses()["t1"] == ("Failed", "JobSubmitFailed")
    assert h.events("t1").count("PodsRefused") == 1
    message = h.row("t1")["message"]
    assert message.startswith(f"{CAUSE}; JobSet falcon-t1 could not create its Jobs for ")
    assert "could not create its Jobs for 600s; JobSet deleted; node pools " in message
    failed = _links(h, "t1")
    assert failed[0].text == CAUSE and failed[0].source.startswith("edge: JobCreationFailed")
    assert failed[-1].text == "task is Failed/JobSubmitFailed"
    assert h.live_pools() == []


def test_a_single_jobs_create_is_refused_in_the_quota_plugins_words(make: Harnesses) -> None:
    h = make(reserved_cluster(count=16))
    h.submit("t1", sim={"outcome": "jobs-refused"})
    h.run()
    assert h.statuses()["t1"] == ("Failed", "JobSubmitFailed")
    assert QUOTA.format(job="falcon-t1") in h.row("t1")["message"]
