"""Every task's current state in memory: ``TaskStates``, folded inline with each
append (``task.evolve``), and the ``Change`` an append made to each task.

Apart from the aggregate itself (``task``): this is the controller's working set of
states, with the staging that keeps a rolled-back append's fold out of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from falcon_es.domain.task import TASK_EVENT_TYPES, TaskState, evolve, new_state


class Change(NamedTuple):
    """One task's state before and after the events of one append (a named tuple:
    immutable, and cheap to build once per folded event)."""

    before: TaskState
    after: TaskState
    folds_abort: bool


def _net(previous: Change | None, before: TaskState, after: TaskState,
         folds_abort: bool) -> Change:
    """The task's change so far in the append: from its state before the append's
    first event of it (``previous``, if any) to ``after``."""
    if previous is None:
        return Change(before, after, folds_abort)
    return Change(previous.before, after, folds_abort or previous.folds_abort)


class TaskStates:
    """Every task's current state, folded inline with each append.

    Writes are staged during the append's transaction and become visible only after
    it commits, so a rolled-back tick leaves no trace here either.
    """

    def __init__(self, states: Iterable[TaskState] = ()) -> None:
        self._states: dict[str, TaskState] = {state.task_id: state for state in states}
        self._staged: dict[str, TaskState] = {}
        self._changes: dict[str, Change] = {}
        #: Committed tasks that have not ended, kept on each commit so that "is any task
        #: still live?" does not look at every task ever seen.
        self._live: set[str] = {s.task_id for s in self._states.values() if not s.is_terminal}

    def get(self, task_id: str) -> TaskState | None:
        return self._staged.get(task_id) or self._states.get(task_id)

    def __contains__(self, task_id: str) -> bool:
        return self.get(task_id) is not None

    def all(self) -> list[TaskState]:
        return list({**self._states, **self._staged}.values())

    def live(self) -> list[TaskState]:
        return [s for s in self.all() if not s.is_terminal]

    def fold(self, recorded: Any) -> list[Change]:
        """Fold recorded events (``store.RecordedEvent``-like) into staged states."""
        changes: list[Change] = []
        staged, tracked = self._staged, self._changes
        for record in recorded:
            event = record.event
            if type(event).__name__ not in TASK_EVENT_TYPES:
                continue
            task_id = record.stream_id
            before = self._before(task_id)
            after = staged[task_id] = evolve(before, event, record.recorded_at)
            change = tracked[task_id] = _net(tracked.get(task_id), before, after,
                                             event.folds_abort)
            changes.append(change)
        return changes

    def apply(self, conn: Any, recorded: Any) -> None:
        """``fold`` for an append, whose states between its events nobody reads: each
        task's state is copied at its first event and evolved in place after it
        (``evolve``'s ``in_place``), and only the net ``Change`` is kept."""
        staged, tracked = self._staged, self._changes
        own: set[str] = set()  # tasks whose staged state this fold built: nobody holds it
        for record in recorded:
            event = record.event
            if type(event).__name__ not in TASK_EVENT_TYPES:
                continue
            task_id = record.stream_id
            if task_id in own:
                change = tracked[task_id]
                evolve(change.after, event, record.recorded_at, in_place=True)
                if event.folds_abort and not change.folds_abort:
                    tracked[task_id] = change._replace(folds_abort=True)
                continue
            own.add(task_id)
            before = self._before(task_id)
            after = staged[task_id] = evolve(before, event, record.recorded_at)
            tracked[task_id] = _net(tracked.get(task_id), before, after, event.folds_abort)

    def _before(self, task_id: str) -> TaskState:
        """The task's state before the next event folded: staged, committed, or new."""
        return self.get(task_id) or new_state(task_id)

    def changes(self) -> list[Change]:
        """Per task, the net change made by the append in progress."""
        return list(self._changes.values())

    def live_count(self) -> int:
        """How many committed tasks have not ended (staged states not included)."""
        return len(self._live)

    def committed(self) -> None:
        live = self._live
        for task_id, state in self._staged.items():
            if state.is_terminal:
                live.discard(task_id)
            else:
                live.add(task_id)
        self._states.update(self._staged)
        self._staged.clear()
        self._changes.clear()

    def discarded(self) -> None:
        self._staged.clear()
        self._changes.clear()

    def forget(self, task_ids: Any) -> None:
        """Drop cached states (after a concurrency error another writer won)."""
        for task_id in task_ids:
            self._states.pop(task_id, None)
            self._live.discard(task_id)
