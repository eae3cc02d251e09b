"""The position Message of each waiting task: its place in the pick order, the names
of the first tasks ahead, why the queue waits and when the task is expected to start.

Rendered per queue (the names of the queue's first tasks joined once, not once per
row), for the queue view's refresh and for a replay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterator, Sequence

from falcon_es.domain.eta import Estimate
from falcon_es.domain.queue_places import Entry
from falcon_es.projections.messages import (
    AHEAD_NAMED,
    CATALOGS,
    EN,
    SEPARATOR,
    clock_span,
    clock_time,
    position_message,
)


def _formatter(key: str, lang: str) -> Callable[..., str]:
    """The catalog template for ``key`` as a function of keyword arguments."""
    template = CATALOGS[lang].get(key) or EN[key]
    if isinstance(template, str):
        return template.format
    return lambda **args: template(args)


@dataclasses.dataclass(frozen=True)
class Wait:
    """What a queue's waiting tasks wait on: the slot holder (``reason``, the same for
    every row) and the queue's expected starts."""

    reason: str | None = None
    estimate: Estimate | None = None


def positions(order: Sequence[Entry], lang: str,
              wait: Wait | None = None) -> Iterator[tuple[str, str]]:
    """(task id, Message) for each waiting task of one queue, in pick order: exactly
    ``position_message(position, ahead)`` and what ``wait`` says, with the names of the
    queue's first tasks (the same for every row) joined once per queue instead of once
    per row."""
    if not order:
        return
    render = renderer(order, lang, wait)
    for index, entry in enumerate(order):
        yield entry.task_id, render(index)


def positions_of(order: Sequence[Entry], wanted: Collection[str],
                 lang: str, wait: Wait | None = None) -> list[tuple[str, str]]:
    """(task id, Message) of the ``wanted`` tasks only, as ``positions`` renders them:
    a task that needs its Message now costs a scan of the order, not the rendering of
    the whole queue."""
    if not order or not wanted:
        return []
    render = renderer(order, lang, wait)
    return [(e.task_id, render(index)) for index, e in enumerate(order) if e.task_id in wanted]


def renderer(order: Sequence[Entry], lang: str, wait: Wait | None) -> Callable[[int], str]:
    """The Message of the task at ``index`` of ``order`` (which must not be empty):
    its position, then why the queue waits and when the task is expected to start."""
    bare = _position_renderer(order, lang)
    if wait is None or (wait.reason is None and wait.estimate is None):
        return bare
    separator = SEPARATOR[lang]
    reason = separator + wait.reason if wait.reason else ""
    estimate = wait.estimate
    if estimate is None:
        return lambda index: bare(index) + reason
    expected = _formatter("wait-expected", lang)

    def render(index: int) -> str:
        start = estimate.start(index)
        low, high = estimate.range_around(start)
        told = expected(at=clock_time(start), span=clock_span(low, high))
        return bare(index) + reason + separator + told

    return render


def _position_renderer(order: Sequence[Entry], lang: str) -> Callable[[int], str]:
    """The position part of the Message of the task at ``index`` of ``order``."""
    named = [f"{e.actor}: {e.name}" for e in order[:AHEAD_NAMED]]
    few = [f" ({', '.join(named[:count])})" for count in range(AHEAD_NAMED + 1)]
    all_named = ", ".join(named)
    position, more = _formatter("position", lang), _formatter("more", lang)
    first = position_message(1, (), lang)

    def render(index: int) -> str:
        if index == 0:
            return first
        if index <= AHEAD_NAMED:
            names = few[index]
        else:
            names = f" ({all_named}, {more(count=index - AHEAD_NAMED)})"
        return position(position=index + 1, ahead=index, names=names)

    return render
