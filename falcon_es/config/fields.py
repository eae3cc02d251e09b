"""How a setting is declared: its variable(s), type, default and one line of doc
(``setting``), and the value types whose parsing says what is wrong in words an
operator can act on.

A variable's value arrives as text; code and tests pass typed values. Each type below
takes either, so one declaration serves the environment and the constructor. The
messages say only what is wrong with the value: the reader of the environment
(``falcon_es.config.source``) puts the variable and the text in front. A check that
names variables itself (one value against another) raises a ``SettingsError``, which
is reported as written.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic.fields import FieldInfo

#: Spellings of yes and no a flag accepts (any case).
TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
FALSE_WORDS = frozenset({"false", "0", "no", "off"})


def setting(default: Any, *variables: str, doc: str) -> Any:
    """A field read from ``variables`` (the first one set wins), with one line of doc
    for the generated reference."""
    return Field(default, description=doc, json_schema_extra={"variables": list(variables)})


def variables_of(field: FieldInfo) -> tuple[str, ...]:
    """The environment variables a declared field is read from (none: not a setting)."""
    extra = field.json_schema_extra
    names = extra.get("variables") if isinstance(extra, dict) else None
    return tuple(str(name) for name in names) if isinstance(names, list) else ()


def _positive_whole(what: str) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise ValueError(f"expected {what}") from None
        if value <= 0:
            raise ValueError("must be positive")
        return int(value)

    return parse


def _whole(value: Any) -> int:
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise ValueError("expected a whole number") from None
    return int(value)


def _number(what: str) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                raise ValueError(f"expected {what}") from None
        return float(value)

    return parse


def _flag(value: Any) -> bool:
    """true/false (also 1/0, yes/no, on/off, any case)."""
    if not isinstance(value, str):
        return bool(value)
    word = value.strip().lower()
    if word not in TRUE_WORDS | FALSE_WORDS:
        raise ValueError("expected true or false")
    return word in TRUE_WORDS


def _text(value: Any) -> Any:
    """Text as given; an empty value is no value (the default applies)."""
    return value.strip() or None if isinstance(value, str) else value


def seconds_up_to(maximum: float) -> BeforeValidator:
    """A duration in seconds that may be fractional or 0, up to ``maximum``."""

    def parse(value: Any) -> float:
        number = _number("a number of seconds")(value)
        if not math.isfinite(number) or number < 0:
            raise ValueError("must be 0 or more seconds")
        if number > maximum:
            raise ValueError(f"at most {maximum:g} seconds")
        return number

    return BeforeValidator(parse)


def one_of(*choices: str, fold: Callable[[str], str] = str) -> BeforeValidator:
    """One of ``choices`` (``fold``: lower() or upper() first, for words whose case
    does not matter)."""

    def parse(value: Any) -> Any:
        if value is None:
            return None
        word = fold(str(value).strip())
        if word not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return word

    return BeforeValidator(parse)


#: A positive whole number of seconds.
Seconds = Annotated[int, BeforeValidator(_positive_whole("a whole number of seconds"))]
#: A positive whole number that counts things.
Count = Annotated[int, BeforeValidator(_positive_whole("a whole number"))]
#: A whole number (its range checked by the group).
Whole = Annotated[int, BeforeValidator(_whole)]
#: A number of seconds, fractional or not (its range checked by the group).
Number = Annotated[float, BeforeValidator(_number("a number of seconds"))]
#: A plain number (a multiplier, a fraction).
Fraction = Annotated[float, BeforeValidator(_number("a number"))]
#: A yes/no switch.
Flag = Annotated[bool, BeforeValidator(_flag)]
#: Free text; empty means unset.
Text = Annotated[str, BeforeValidator(_text)]
#: Free text or nothing.
OptionalText = Annotated[str | None, BeforeValidator(_text)]
