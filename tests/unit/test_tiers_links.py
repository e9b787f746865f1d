"""kvlib.tiers.links: the link table, bits against bytes, PCIe's line code."""

from __future__ import annotations

import pytest

from kvlib.tiers.links import LINKS, get_link, link_names, pcie_gbit_per_s, to_bytes_per_s


def test_bits_are_an_eighth_of_bytes() -> None:
    assert to_bytes_per_s(400, "Gb/s") == 50 * 10**9
    assert to_bytes_per_s(50, "GB/s") == 50 * 10**9
    assert to_bytes_per_s(13_000, "MB/s") == 13 * 10**9


def test_unknown_unit_is_named() -> None:
    with pytest.raises(ValueError, match="unit 'Gbps'"):
        to_bytes_per_s(1, "Gbps")


def test_pcie_gen5_x16_is_about_63_gb_per_s() -> None:
    # 32 GT/s x 16 lanes x 128/130, one direction, in bytes.
    assert pcie_gbit_per_s(32, 16) == pytest.approx(504.123, rel=1e-5)
    assert get_link("pcie5").bytes_per_s == pytest.approx(32e9 * 16 * 128 / 130 / 8)
    assert get_link("pcie4").bytes_per_s == pytest.approx(get_link("pcie5").bytes_per_s / 2)


def test_a_400g_nic_moves_50_gb_per_s_not_400() -> None:
    for name in ("ib-400g", "roce-400g"):
        assert get_link(name).bytes_per_s == 50e9


def test_every_row_cites_a_source_and_measures_below_its_datasheet() -> None:
    for link in LINKS.values():
        assert link.source and link.joins
        measured = link.measured_bytes_per_s
        if measured is not None:
            assert link.measured_source != "no measurement recorded"
            assert measured < link.bytes_per_s


def test_unknown_link_lists_the_known_ones_in_one_line() -> None:
    with pytest.raises(KeyError) as err:
        get_link("pcie6")
    message = str(err.value.args[0])
    assert "\n" not in message
    assert all(name in message for name in link_names())
