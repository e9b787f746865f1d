"""The links a KV cache crosses between tiers, one row a link, each figure with its source.

Every figure is one direction of one GPU's link (a reload moves data one way). Vendors
print link speeds in three units: network cards in gigabits a second (``Gb/s``), NVLink
and PCIe summaries in gigabytes a second (``GB/s``, often both directions added), drives
in megabytes a second (``MB/s``). :func:`to_bytes_per_s` is the only place a printed
figure becomes bytes a second, so a "400 Gb/s" NIC is 50 GB/s here, never 400.

PCIe is printed as a transfer rate per lane (``GT/s``); :func:`pcie_gbit_per_s` turns it
into the data rate of ``lanes`` lanes with PCIe 3.0 and later's 128b/130b line code
(PCI-SIG, PCI Express Base Specification 5.0, section 4.2: 128 data bits in every 130
sent). Packet headers (TLP/DLLP) cost a further few percent not counted in the datasheet
figure; where a measured figure is published the row records it beside the datasheet's.

``setup_s`` is a fixed cost a transfer pays before its bytes flow (a DMA set-up, a
drive's command latency). No vendor publishes one for a KV reload; every row states 0
and the functions that use it take it as an argument.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib._validate import require_positive

__all__ = [
    "LINKS",
    "Link",
    "get_link",
    "link_names",
    "pcie_gbit_per_s",
    "to_bytes_per_s",
]

# Bytes a second in one unit of each printed rate: bits are an eighth of a byte.
_BYTES_PER_S = {"Gb/s": 10**9 / 8, "GB/s": 10**9, "MB/s": 10**6}

# PCIe 3.0 and later send 130 bits for every 128 data bits (PCIe Base Spec. 5.0, 4.2).
_PCIE_ENCODING = 128 / 130


def to_bytes_per_s(value: float, unit: str) -> float:
    """A printed rate in bytes a second: ``Gb/s`` x 10**9 / 8, ``GB/s`` x 10**9,
    ``MB/s`` x 10**6 (decimal prefixes, as link datasheets use them)."""
    require_positive(value, "link rate")
    if unit not in _BYTES_PER_S:
        raise ValueError(f"link rate unit {unit!r} is not one of {', '.join(_BYTES_PER_S)}")
    return value * _BYTES_PER_S[unit]


def pcie_gbit_per_s(gt_per_s: float, lanes: int) -> float:
    """Data rate of ``lanes`` PCIe lanes at ``gt_per_s`` transfers a second, one direction,
    in Gb/s: ``GT/s x lanes x 128 / 130`` (one bit a transfer, 128b/130b line code)."""
    require_positive(gt_per_s, "gt_per_s")
    require_positive(lanes, "lanes")
    return gt_per_s * lanes * _PCIE_ENCODING


@dataclass(frozen=True)
class Link:
    """One link, one direction: the datasheet's figure and unit, and a measured one where
    published, each with its unit and source."""

    name: str
    joins: str  # what the link connects
    datasheet_rate: float
    datasheet_unit: str
    source: str
    measured_rate: float | None = None
    measured_unit: str = "GB/s"
    measured_source: str = "no measurement recorded"
    setup_s: float = 0.0

    @property
    def bytes_per_s(self) -> float:
        """The datasheet's rate in bytes a second (:func:`to_bytes_per_s`)."""
        return to_bytes_per_s(self.datasheet_rate, self.datasheet_unit)

    @property
    def measured_bytes_per_s(self) -> float | None:
        """The measured rate in bytes a second, or None where none is recorded."""
        if self.measured_rate is None:
            return None
        return to_bytes_per_s(self.measured_rate, self.measured_unit)


_PCIE_SPEC = "PCI-SIG PCI Express Base Specification {v}: {gt} GT/s a lane, 128b/130b, x16"

LINKS: dict[str, Link] = {
    link.name: link
    for link in (
        Link("pcie4", "host DRAM to GPU (PCIe 4.0 x16, A100)", pcie_gbit_per_s(16, 16),
             "Gb/s", _PCIE_SPEC.format(v="4.0", gt=16), 25.0, "GB/s",
             "25 GB/s peak measured on an A100's PCIe 4.0 x16 (Qureshi et al., BaM, ASPLOS "
             "2023; ZaidQureshi/bam issue 54)"),
        Link("pcie5", "host DRAM to GPU (PCIe 5.0 x16, H100/H200)", pcie_gbit_per_s(32, 16),
             "Gb/s", _PCIE_SPEC.format(v="5.0", gt=32)),
        Link("nvlink-c2c", "Grace LPDDR5X to Hopper HBM on a GH200", 450.0, "GB/s",
             "NVIDIA Grace Hopper Superchip Architecture whitepaper (2023): NVLink-C2C 900 "
             "GB/s total, 450 GB/s each direction"),
        Link("nvlink4", "GPU to GPU in an HGX H100/H200 (NVLink 4 through NVSwitch)", 450.0,
             "GB/s", "NVIDIA H100 Tensor Core GPU datasheet (2023): NVLink 900 GB/s, both "
             "directions added", 380.0, "GB/s",
             "~380 GB/s one direction, p2pBandwidthLatencyTest on an HGX H100 SXM "
             "(NVIDIA/nccl issue 1264, 2024)"),
        Link("nvlink5", "GPU to GPU in an HGX B200 (NVLink 5)", 900.0, "GB/s",
             "NVIDIA HGX B200 datasheet (2025): NVLink 1.8 TB/s a GPU, both directions added"),
        Link("nvme-gen5", "one PCIe 5.0 NVMe drive to host memory", 13_000.0, "MB/s",
             "Samsung PM1743 announcement (Samsung Newsroom, Dec. 2021): 13,000 MB/s "
             "sequential read, 6,600 MB/s write"),
        Link("ib-400g", "GPU to a remote node (InfiniBand NDR, one ConnectX-7 port)", 400.0,
             "Gb/s", "NVIDIA DGX BasePOD reference architecture, Core Components: ConnectX-7 VPI, "
             "up to 400 Gb/s InfiniBand a port"),
        Link("roce-400g", "GPU to a remote node (400 GbE RoCE, one ConnectX-7 port)", 400.0,
             "Gb/s", "NVIDIA DGX BasePOD reference architecture, Core Components: ConnectX-7 VPI, "
             "up to 400 Gb/s Ethernet a port"),
    )
}


def link_names() -> list[str]:
    """Names accepted by :func:`get_link`."""
    return list(LINKS)


def get_link(name: str) -> Link:
    """The link called ``name``; KeyError with one line listing the known names."""
    try:
        return LINKS[name]
    except KeyError:
        raise KeyError(f"unknown link {name!r}: use one of {', '.join(LINKS)}") from None
