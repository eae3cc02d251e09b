"""The shapes GKE offers: v5e/v6e 2x4 as one 8-chip or two 4-chip VMs,
Multislice only on multi-host slices, and the v5p/v7x topology lists from Cloud TPU's
tables and xpk (sources in ``falcon_es/domain/tpu.py`` and ``docs/FIDELITY.md``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from falcon_es.adapters.sim import SimClusterConfig
from falcon_es.adapters.sim.config import ReservationConfig
from falcon_es.domain.spec import SpecError, SpecLimits, parse_spec
from falcon_es.domain.tpu import (
    TPU_TYPES, TopologyError, choose_machine, machine_types, slice_shape,
)
from tests.support.harness import Harness, flex_cluster, reserved_cluster

Make = Callable[..., Harness]

#: Cloud TPU's v5p table (tpu/docs/v5p, "Configurations").
CLOUD_TPU_V5P = ("2x2x1", "2x2x2", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16",
                 "8x16x16", "16x16x16", "16x16x24")
#: A few of xpk's explicit tpu7x-standard-4t list (src/xpk/core/system_characteristics.py).
XPK_TPU7X = ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x244", "12x12x36", "16x16x32")


def spec(**fields: object) -> dict[str, object]:
    return {"image": "busybox", "tpu_type": "v6e", "topology": "2x2", **fields}


# ------------------------------------------------------------------ the lists

def test_v5p_admits_every_row_of_cloud_tpus_table_and_nothing_past_96_cubes() -> None:
    v5p = TPU_TYPES["v5p"].topologies
    assert set(CLOUD_TPU_V5P) <= set(v5p)
    assert "16x16x28" not in v5p  # 112 cubes: past the largest single slice
    assert "2x2x8" not in v5p and "2x8x8" not in v5p  # no side of 2 beyond xpk's four


def test_v7x_admits_xpks_ironwood_shapes() -> None:
    assert set(XPK_TPU7X) | {"1x1x1"} <= set(TPU_TYPES["v7x"].topologies)
    assert "16x16x40" not in TPU_TYPES["v7x"].topologies  # 160 cubes: more than a pod


# ----------------------------------------------------------------- 2x4 machines

@pytest.mark.parametrize("tpu_type", ["v5e", "v6e"])
def test_2x4_is_one_8_chip_vm_or_two_4_chip_vms(tpu_type: str) -> None:
    eight, four = machine_types(tpu_type, "2x4")
    assert (eight.endswith("-8t"), four.endswith("-4t")) == (True, True)
    assert (slice_shape(tpu_type, "2x4").hosts, slice_shape(tpu_type, "2x4", four).hosts) == (1, 2)
    assert choose_machine(tpu_type, "2x4", reserved=four) == four
    assert choose_machine(tpu_type, "2x4", multislice=True) == four
    assert choose_machine(tpu_type, "2x4") == eight  # the documented default


def test_a_machine_type_that_does_not_make_the_topology_is_refused() -> None:
    with pytest.raises(TopologyError):
        slice_shape("v6e", "2x2", "ct6e-standard-8t")
    with pytest.raises(SpecError) as refused:
        parse_spec(spec(machine_type="ct6e-standard-8t"))
    assert (refused.value.reason, refused.value.field) == ("InvalidField", "machine_type")
    assert "runs on ct6e-standard-4t" in refused.value.detail


def test_more_than_one_slice_needs_a_multi_host_shape() -> None:
    limits = SpecLimits(max_slices=4)
    with pytest.raises(SpecError) as refused:
        parse_spec(spec(slices=2), limits)
    assert (refused.value.reason, refused.value.field) == ("InvalidField", "slices")
    assert refused.value.detail == ("2 slices of v6e 2x2: GKE Multislice runs only on "
                                    "multi-host TPU slices, and 2x2 is one VM "
                                    "(ct6e-standard-4t)")
    with pytest.raises(SpecError):
        parse_spec(spec(topology="2x4", slices=2, machine_type="ct6e-standard-8t"), limits)
    assert parse_spec(spec(topology="2x4", slices=2), limits).slices == 2


# ------------------------------------------------------------ end to end on the sim

def four_chip_reservation() -> SimClusterConfig:
    cluster = reserved_cluster(count=4)
    return dataclasses.replace(cluster, reservations=(
        ReservationConfig("v6e-res-r", 4, 0, "ct6e-standard-4t"),))


def test_2x4_on_a_reservation_of_4_chip_vms_runs_on_two_vms(make: Make) -> None:
    h = make(four_chip_reservation())
    h.submit("t1", topology="2x4")
    h.run()
    assert h.statuses()["t1"] == ("Succeeded", None)
    assert "2/2 active" in h.messages["t1"]
    (pool,) = h.world.pools(include_deleted=True)
    assert (pool.machine_type, pool.hosts) == ("ct6e-standard-4t", 2)


def test_2x4_without_a_reservation_is_one_8_chip_vm_unless_the_spec_says(make: Make) -> None:
    h = make(flex_cluster())
    h.submit("one", topology="2x4")
    h.submit("two", topology="2x4", machine_type="ct6e-standard-4t")
    h.run()
    assert h.statuses() == {"one": ("Succeeded", None), "two": ("Succeeded", None)}
    made = {p.name: (p.machine_type, p.hosts) for p in h.world.pools(include_deleted=True)}
    assert made == {"falcon-one-2x4": ("ct6e-standard-8t", 1),
                    "falcon-two-2x4": ("ct6e-standard-4t", 2)}
