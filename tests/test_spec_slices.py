"""``slices`` and ``max_restarts`` in a task spec: the bounds, and what each means."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from falcon_es.config.settings import Settings, SettingsError
from falcon_es.domain.spec import (
    MAX_RESTARTS, SimBehaviour, SpecError, SpecLimits, TaskSpec, parse_spec,
)

BASE = {"image": "us-docker.pkg.dev/p/r/train:1", "tpu_type": "v6e", "topology": "4x4"}
FOUR = SpecLimits(max_slices=4)


def test_one_slice_and_no_restarts_by_default() -> None:
    spec = parse_spec(BASE, FOUR)
    assert (spec.slices, spec.max_restarts) == (1, 0)
    assert spec.to_data()["slices"] == 1


def test_slices_up_to_the_configured_maximum() -> None:
    spec = parse_spec({**BASE, "slices": 4, "max_restarts": 3}, FOUR)
    assert (spec.slices, spec.max_restarts) == (4, 3)


@pytest.mark.parametrize("value", [0, -1, 5, 2.0, "2", True, None, [2]])
def test_slices_out_of_range_or_not_a_whole_number(value: Any) -> None:
    with pytest.raises(SpecError) as error:
        parse_spec({**BASE, "slices": value}, FOUR)
    assert error.value.field == "slices"
    assert "from 1 to 4" in error.value.detail and "FALCON_MAX_SLICES" in error.value.detail


def test_a_deployment_limited_to_one_slice_refuses_two() -> None:
    with pytest.raises(SpecError, match="from 1 to 1"):
        parse_spec({**BASE, "slices": 2}, SpecLimits(max_slices=1))


@pytest.mark.parametrize("value", [-1, MAX_RESTARTS + 1, 1.5, "1", False])
def test_max_restarts_bounds(value: Any) -> None:
    with pytest.raises(SpecError) as error:
        parse_spec({**BASE, "slices": 2, "max_restarts": value}, FOUR)
    assert error.value.field == "max_restarts"


def test_restarts_need_a_jobset() -> None:
    with pytest.raises(SpecError) as error:
        parse_spec({**BASE, "max_restarts": 2}, FOUR)
    assert error.value.field == "max_restarts" and "multi-slice" in error.value.detail


def test_a_single_slice_may_retry_only_the_exit_codes_it_names() -> None:
    spec = parse_spec({**BASE, "max_restarts": 2, "retry_exit_codes": [42, 3, 42]}, FOUR)
    assert (spec.max_restarts, spec.retry_exit_codes) == (2, (3, 42))
    assert spec.to_data()["retry_exit_codes"] == [3, 42]
    assert parse_spec(BASE, FOUR).retry_exit_codes == ()


@pytest.mark.parametrize(("value", "field"), [
    (0, "retry_exit_codes"), ([0], "retry_exit_codes[0]"), ([256], "retry_exit_codes[0]"),
    ([1, "2"], "retry_exit_codes[1]"), ([True], "retry_exit_codes[0]"),
    (list(range(1, 257)), "retry_exit_codes"),
])
def test_retry_exit_codes_are_whole_numbers_1_to_255(value: Any, field: str) -> None:
    with pytest.raises(SpecError) as error:
        parse_spec({**BASE, "retry_exit_codes": value}, FOUR)
    assert error.value.field == field


def test_the_maximum_is_a_setting() -> None:
    assert Settings.from_env({"FALCON_MAX_SLICES": "8"}).lifecycle.max_slices == 8
    for bad in ("0", "two", "-3"):
        with pytest.raises(SettingsError, match="FALCON_MAX_SLICES"):
            Settings.from_env({"FALCON_MAX_SLICES": bad})


def test_partial_create_is_off_unless_a_setting_asks_for_it() -> None:
    assert Settings.from_env({}).features.multislice_partial_create is False
    for on in ("true", "TRUE", "1", "yes", "on"):
        assert Settings.from_env({"FALCON_MULTISLICE_PARTIAL_CREATE": on}).features.multislice_partial_create
    for off in ("false", "0", "no", "off", ""):
        assert not Settings.from_env(
            {"FALCON_MULTISLICE_PARTIAL_CREATE": off}).features.multislice_partial_create
    with pytest.raises(SettingsError, match="FALCON_MULTISLICE_PARTIAL_CREATE='sometimes': "
                                           "expected true or false"):
        Settings.from_env({"FALCON_MULTISLICE_PARTIAL_CREATE": "sometimes"})


def test_a_spec_reads_as_its_fields_in_declaration_order() -> None:
    """``to_data`` is ``dataclasses.asdict`` with the sequences as JSON lists and the
    environment as a mapping: what ``TaskAccepted`` stores and ``from_data`` reads."""
    spec = TaskSpec("img", "v6e", "2x2", command=("python", "train.py"), args=("--x",),
                    env=(("A", "1"), ("B", "2")), supply_mode="flex-start",
                    sim=SimBehaviour(duration_seconds=5.0, outcome="fail", exit_code=3),
                    slices=2, max_restarts=1, priority=7, machine_type="ct6e-standard-4t",
                    retry_exit_codes=(42,))
    expected = {**dataclasses.asdict(spec), "command": ["python", "train.py"], "args": ["--x"],
                "env": {"A": "1", "B": "2"}, "retry_exit_codes": [42]}
    data = spec.to_data()
    assert data == expected and list(data) == list(expected)
    assert data["sim"] == {"duration_seconds": 5.0, "outcome": "fail", "exit_code": 3}
    assert TaskSpec.from_data(data, "v6e", "2x2") == spec
