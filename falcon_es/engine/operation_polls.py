"""When each task's pool create is next looked at: the ticks' own bookkeeping of the
calls they made to GKE, kept apart from the lifecycle index. Also the tries of a wait
on the world (a reservation too full, nodes not Ready) that found what the log already
says: those append nothing (the log grows with what changes, not with time), so the
try's number and the next one's moment are kept here.

A look at a create (its operation, or the pool itself) is a call against the project's
GKE quota and records no event when nothing changed, so "not before" is no fact of
the log: a projection, written only from committed events, cannot hold it. Handlers
write it here (``polled``) during a tick; the lifecycle index reads it to tell when a
task next needs a look by time alone, and drops a poll once the task moved on (a poll
decided on version N of a task says nothing about version N+1). It is lost on restart,
which costs one look per create in flight.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import NamedTuple

from sortedcontainers import SortedKeyList

from falcon_es.domain.task import TaskState


class Poll(NamedTuple):
    """The next look at one task's create, as decided on one version of the task."""

    version: int
    next_at: dt.datetime
    #: When it was decided: a wake moment already due then (a retry just tried) is
    #: spent, and the poll is the next moment.
    decided_at: dt.datetime
    #: The number of the wait's try made then, when the poll is a wait's silent try
    #: (0: a look at a create).
    attempt: int = 0


def _moment(entry: tuple[dt.datetime, str]) -> dt.datetime:
    return entry[0]


class OperationPolls:
    """The next look at each task's create, by task and by moment."""

    def __init__(self) -> None:
        self._polls: dict[str, Poll] = {}
        self._by_moment: SortedKeyList = SortedKeyList(key=_moment)  # (next_at, task id)

    def polled(self, state: TaskState, next_at: dt.datetime | None,
               now: dt.datetime, attempt: int = 0) -> None:
        """The task's create was looked at (or, ``attempt``, its wait tried for the
        attempt-th time): look again at ``next_at`` (None: the operation is done, no
        more polls)."""
        self.forget(state.task_id)
        if next_at is not None:
            self._polls[state.task_id] = Poll(state.version, next_at, now, attempt)
            self._by_moment.add((next_at, state.task_id))

    def due(self, state: TaskState) -> dt.datetime | None:
        """When the task's create is to be looked at again (None: now)."""
        poll = self._polls.get(state.task_id)
        return poll.next_at if poll is not None and poll.version == state.version else None

    def tried(self, state: TaskState) -> Poll | None:
        """The last silent try of the task's wait, as of this version of the task."""
        poll = self._polls.get(state.task_id)
        return poll if poll is not None and poll.attempt and poll.version == state.version else None

    def of(self, task_id: str) -> Poll | None:
        return self._polls.get(task_id)

    def moved(self, state: TaskState) -> None:
        """The task has a new committed version: a poll decided on another goes."""
        poll = self._polls.get(state.task_id)
        if poll is not None and poll.version != state.version:
            self.forget(state.task_id)

    def forget(self, task_id: str) -> None:
        poll = self._polls.pop(task_id, None)
        if poll is not None:
            self._by_moment.remove((poll.next_at, task_id))

    def clear(self) -> None:
        self._polls.clear()
        self._by_moment.clear()

    def earliest(self) -> dt.datetime | None:
        return self._by_moment[0][0] if self._by_moment else None

    def until(self, moment: dt.datetime) -> Iterator[tuple[dt.datetime, str]]:
        """(next look, task id) of the polls due by ``moment``, earliest first."""
        return iter(self._by_moment.irange_key(max_key=moment))
