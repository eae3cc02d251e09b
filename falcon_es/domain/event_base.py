"""The base every event type derives from, apart from the event types themselves.

Kept out of ``events`` so that event types may live in the module of the concern they
record (the slot lending of ``slot_loans``, say) while ``events`` still registers every
one of them: a module defining events imports this one, never ``events``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

from falcon_es.domain import event_json
from falcon_es.domain.event_json import Conversions, fields_text, to_json

JsonDict = dict[str, Any]


class UnknownEventType(LookupError):
    """A stored row names an event type this code does not know."""


@functools.cache
def conversions_of(cls: type) -> Conversions:
    """The fields of an event class whose JSON form differs, worked out once a class."""
    return event_json.conversions(cls)


@dataclasses.dataclass(frozen=True)
class Event:
    """Base of all events. ``schema_version`` is the class's current version."""

    schema_version: ClassVar[int] = 1
    #: True for events that fold an abort the upper layer wrote into the job row.
    #: The job-table projection may overwrite a row in status ``Aborting`` only then.
    folds_abort: ClassVar[bool] = False
    #: Failure reason set when the event moves a task to ``Failed``.
    failure_reason: ClassVar[str | None] = None

    @property
    def type_name(self) -> str:
        return type(self).__name__

    def failure(self) -> str | None:
        """The Reason a task gets when this event moves it to ``Failed``."""
        return self.failure_reason

    def to_data(self) -> JsonDict:
        # An event's instance dict holds exactly its fields, in field order (ClassVars
        # live on the class); cheaper than dataclasses.fields() on the append/fold path.
        # Only fields whose JSON form differs (datetimes, tuples) need converting.
        # A class is hashable; mypy takes the frozen dataclass's __hash__ for the class's.
        conversions = conversions_of(type(self))  # type: ignore[arg-type]
        if not conversions:
            return {name: to_json(value) for name, value in self.__dict__.items()}
        data = dict(self.__dict__)
        for name, _ in conversions:
            data[name] = to_json(data[name])
        return data

    def to_json_text(self) -> str:
        """``json.dumps(self.to_data())``, byte for byte, at a fraction of the cost:
        the append encodes every event it stores."""
        return fields_text(self.__dict__)
