"""The per-handler tests' fixture: ``make_bench`` builds benches (``HandlerBench``)
on the ``db_url`` database and the virtual clock and closes them afterwards.

Most handler decisions read no SQL of their own, so their modules pin ``db_url`` to
SQLite (``pytestmark = SQLITE_ONLY``, from ``tests.support.bench``); intake and the
outbox, which read the job table and the log's checkpoint, run on both dialects.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from falcon_es.domain.clock import VirtualClock
from tests.support.bench import HandlerBenches


@pytest.fixture
def make_bench(db_url: str, clock: VirtualClock) -> Iterator[HandlerBenches]:
    benches = HandlerBenches(db_url, clock)
    yield benches
    benches.close()
