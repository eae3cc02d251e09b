"""TPU generations GKE offers: accelerator labels, machine types and valid topologies.

Facts from ``shared/reference/gcp-k8s-apis.md`` §2 (xpk's system characteristics and
the GKE/TPU docs). A slice's chips = product of the topology; multi-host slices use
4-chip VMs, one Pod per VM; the 8-chip machines give a single-host 2x4.
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


#: The 2D slice shapes of v5e and v6e (Cloud TPU docs; same list for both).
_GRID2 = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")


def _grid3(limit: int, *, single_chip: bool, max_dim: int = 16) -> tuple[str, ...]:
    sizes = [1, 2, 4, 8, 12, 16]
    shapes = []
    for a in sizes:
        for b in sizes:
            for c in sizes:
                if a <= b <= c and a >= 2 and a * b * c <= limit and max(a, b, c) <= max_dim:
                    shapes.append(f"{a}x{b}x{c}")
    return (*(("1x1x1",) if single_chip else ()), "2x2x1", *shapes)


TPU_TYPES: Mapping[str, TpuType] = MappingProxyType({
    "v5e": TpuType("v5e", "tpu-v5-lite-podslice", "ct5lp-hightpu", 2, (1, 4, 8), _GRID2),
    "v5p": TpuType("v5p", "tpu-v5p-slice", "ct5p-hightpu", 3, (4,), _grid3(6144, single_chip=False)),
    "v6e": TpuType("v6e", "tpu-v6e-slice", "ct6e-standard", 2, (1, 4, 8), _GRID2),
    "v7x": TpuType("v7x", "tpu7x", "tpu7x-standard", 3, (1, 4), _grid3(9216, single_chip=True)),
})


class TopologyError(ValueError):
    """A topology that the TPU type does not offer."""


def slice_shape(tpu_type: str, topology: str) -> SliceShape:
    kind = TPU_TYPES.get(tpu_type)
    if kind is None:
        raise TopologyError(
            f"unknown TPU type {tpu_type!r}; expected one of {', '.join(sorted(TPU_TYPES))}"
        )
    if topology not in kind.topologies:
        raise TopologyError(
            f"topology {topology!r} is not offered for {tpu_type}; expected one of "
            f"{', '.join(kind.topologies[:12])}{' ...' if len(kind.topologies) > 12 else ''}"
        )
    chips = math.prod(int(d) for d in topology.split("x"))
    single = [c for c in kind.single_host_chips if c == chips]
    if single:
        per_host, hosts = single[0], 1
    elif chips == 4 or (kind.dimensions == 3 and topology == "2x2x1"):
        per_host, hosts = 4, 1
    else:
        per_host, hosts = 4, chips // 4
    return SliceShape(tpu_type, topology, chips, hosts, per_host,
                      f"{kind.machine_prefix}-{per_host}t")
