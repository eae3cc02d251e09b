"""The declared variables' values, as text, put where the declaration says, from the
environment ``Settings.from_env`` (its one reader) hands over; and a refused value
turned into one sentence naming the variable, the text and what is wrong with it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from falcon_es.config.errors import SettingsError
from falcon_es.config.fields import variables_of


def groups_of(settings_cls: type[BaseModel]) -> Iterator[tuple[str, type[BaseModel]]]:
    """Each group of ``settings_cls``: its attribute name and its model."""
    for name, field in settings_cls.model_fields.items():
        model = field.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            yield name, model


class Variables(PydanticBaseSettingsSource):
    """The declared variables set in ``environ``, as group -> field -> text. An empty
    value is no value: the default applies."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.environ = environ

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # the groups are read whole, in __call__

    def __call__(self) -> dict[str, Any]:
        read: dict[str, Any] = {}
        for group, model in groups_of(self.settings_cls):
            found = {name: text for name, field in model.model_fields.items()
                     if (text := self._first_set(variables_of(field))) is not None}
            if found:
                read[group] = found
        return read

    def _first_set(self, names: tuple[str, ...]) -> str | None:
        for name in names:
            text = self.environ.get(name)
            if text is not None and text.strip():
                return text
        return None


def refused(error: ValidationError, settings_cls: type[BaseModel],
            group_errors: Mapping[str, type[SettingsError]],
            default: type[SettingsError] = SettingsError) -> SettingsError:
    """The first refused value as one error of its group's class (``group_errors``,
    else ``default``): ``VARIABLE='text': what is wrong`` (a check that names
    its variables itself is reported as it says)."""
    problem = error.errors()[0]
    location = [str(part) for part in problem["loc"]]
    group = location[0] if location else ""
    cause = (problem.get("ctx") or {}).get("error")
    kind = group_errors.get(group, default)
    if isinstance(cause, SettingsError):
        return kind(str(cause))
    words = str(cause) if cause is not None else problem["msg"]
    variable = _variable(settings_cls, location)
    if variable is None:
        return kind(f"{'.'.join(location) or 'settings'}: {words}")
    return kind(f"{variable}={problem['input']!r}: {words}")


def _variable(settings_cls: type[BaseModel], location: list[str]) -> str | None:
    if len(location) < 2:
        return None
    models = dict(groups_of(settings_cls))
    field = models[location[0]].model_fields.get(location[1]) if location[0] in models else None
    names = variables_of(field) if field is not None else ()
    return names[0] if names else None
