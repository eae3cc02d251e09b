"""TPU generations GKE offers: accelerator labels, machine types and valid topologies.

Facts from ``shared/reference/gcp-k8s-apis.md`` §2 and ``gke-day-one.md`` §5 (xpk's
system characteristics, the GKE and Cloud TPU docs; each list below names its source,
and ``docs/FIDELITY.md`` has a row for each). A slice's chips = product of the
topology; multi-host slices use 4-chip VMs, one Pod per VM.

v5e / v6e ``2x4`` is the one shape two machine types make: one 8-chip VM
(``ct5lp-hightpu-8t``, ``ct6e-standard-8t``: a single-host slice) or two 4-chip VMs
(``-4t``: a multi-host slice, as xpk and GKE's Multislice tutorial run it).
``choose_machine`` picks: the spec's ``machine_type``; else, for a multi-slice task,
the multi-host one (GKE Multislice runs only on multi-host slices); else the machine
the task's reservation holds; else the default, the first of ``machine_types``
(one 8-chip VM: what Falcon-ES always did, so tasks and pools made before keep their
shape).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType


@dataclasses.dataclass(frozen=True)
class TpuType:
    name: str
    accelerator: str  # value of cloud.google.com/gke-tpu-accelerator
    machine_prefix: str  # machine type without the "-<chips>t" suffix
    dimensions: int  # 2 for v5e/v6e, 3 for v5p/v7x
    single_host_chips: tuple[int, ...]  # chips per VM offered for single-host shapes
    topologies: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class SliceShape:
    tpu_type: str
    topology: str
    chips: int
    hosts: int
    chips_per_host: int
    machine_type: str

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1


#: The 2D slice shapes of v5e and v6e: Cloud TPU docs (tpu/docs/v5e, tpu/docs/v6e),
#: the same list for both; xpk's system_characteristics.py lists the same ones.
_GRID2 = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")
#: The small 3D shapes below one 4x4x4 cube: Cloud TPU's v5p table (2x2x1, 2x2x2,
#: 2x4x4) and xpk's ``generate_tpu_topologies`` (adds 2x2x4).
_SUB_CUBE = ("2x2x1", "2x2x2", "2x2x4", "2x4x4")
#: The largest single v5p slice: "The largest job that can be scheduled is a 96 cube
#: (6144 chip) job ... The maximum v5p shape is 16x16x24" (Cloud TPU, tpu/docs/v5p).
V5P_MAX_CUBES = 96
#: A TPU7x pod's 9,216 chips as 4x4x4 cubes (Cloud TPU, tpu/docs/tpu7x); xpk
#: generates Ironwood topologies up to ``max_cubes=144``.
V7X_MAX_CUBES = 144


def _cubes(max_cubes: int) -> tuple[str, ...]:
    """``AxBxC`` with A <= B <= C, each a multiple of 4 up to 256, at most ``max_cubes``
    4x4x4 cubes: xpk's ``generate_tpu_topologies`` (src/xpk/core/system_characteristics.py),
    which holds every row of Cloud TPU's v5p table."""
    sides = range(1, 65)
    return tuple(f"{4 * a}x{4 * b}x{4 * c}" for a in sides for b in sides if b >= a
                 for c in sides if c >= b and a * b * c <= max_cubes)


TPU_TYPES: Mapping[str, TpuType] = MappingProxyType({
    "v5e": TpuType("v5e", "tpu-v5-lite-podslice", "ct5lp-hightpu", 2, (1, 4, 8), _GRID2),
    "v5p": TpuType("v5p", "tpu-v5p-slice", "ct5p-hightpu", 3, (4,),
                   (*_SUB_CUBE, *_cubes(V5P_MAX_CUBES))),
    "v6e": TpuType("v6e", "tpu-v6e-slice", "ct6e-standard", 2, (1, 4, 8), _GRID2),
    # 1x1x1 is xpk's tpu7x-standard-1t.
    "v7x": TpuType("v7x", "tpu7x", "tpu7x-standard", 3, (1, 4),
                   ("1x1x1", *_SUB_CUBE, *_cubes(V7X_MAX_CUBES))),
})


class TopologyError(ValueError):
    """A topology that the TPU type does not offer."""


def _kind(tpu_type: str) -> TpuType:
    kind = TPU_TYPES.get(tpu_type)
    if kind is None:
        raise TopologyError(
            f"unknown TPU type {tpu_type!r}; expected one of {', '.join(sorted(TPU_TYPES))}"
        )
    return kind


def _chips(topology: str) -> int:
    return math.prod(int(d) for d in topology.split("x"))


def machine_types(tpu_type: str, topology: str) -> tuple[str, ...]:
    """The machine types that make the topology, the default first: the single-host
    machine with that many chips, and the 4-chip VM (several of them for more chips)."""
    kind = _kind(tpu_type)
    chips = _chips(topology)
    found = [f"{kind.machine_prefix}-{chips}t"] if chips in kind.single_host_chips else []
    four = f"{kind.machine_prefix}-4t"
    if chips % 4 == 0 and four not in found:
        found.append(four)
    return tuple(found)


def _per_host(machine_type: str) -> int:
    return int(machine_type.rsplit("-", 1)[1].rstrip("t"))


def choose_machine(tpu_type: str, topology: str, *, asked: str | None = None,
                   reserved: str | None = None, multislice: bool = False) -> str:
    """The machine type a task's slices are made of (see the module docstring)."""
    if asked:
        return asked
    offered = machine_types(tpu_type, topology)
    if multislice:
        offered = tuple(m for m in offered if _chips(topology) > _per_host(m)) or offered
    return reserved if reserved in offered else offered[0]


def multi_host_machine(tpu_type: str, topology: str) -> str | None:
    """The machine type that makes the topology a multi-host slice, if any."""
    return next((m for m in machine_types(tpu_type, topology)
                 if _chips(topology) > _per_host(m)), None)


def shape_of(tpu_type: str, topology: str, machine_type: str) -> SliceShape:
    """The slice ``machine_type`` VMs make of the topology, without checking the
    topology against the lists: a task's own shape, checked once at intake."""
    chips = _chips(topology)
    per_host = _per_host(machine_type)
    return SliceShape(tpu_type, topology, chips, max(1, chips // per_host), per_host,
                      machine_type)


def slice_shape(tpu_type: str, topology: str, machine_type: str | None = None) -> SliceShape:
    """The slice of an offered topology on ``machine_type`` (None: the default)."""
    kind = _kind(tpu_type)
    if topology not in kind.topologies:
        raise TopologyError(
            f"topology {topology!r} is not offered for {tpu_type}; expected one of "
            f"{', '.join(kind.topologies[:12])}{' ...' if len(kind.topologies) > 12 else ''}"
        )
    offered = machine_types(tpu_type, topology)
    if machine_type is None:
        machine_type = offered[0]
    elif machine_type not in offered:
        raise TopologyError(f"{tpu_type} {topology} runs on {' or '.join(offered)}, "
                            f"not {machine_type!r}")
    return shape_of(tpu_type, topology, machine_type)
