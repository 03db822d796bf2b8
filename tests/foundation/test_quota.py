"""Nova's flavor quota extra specs: mapped to libvirt's names, and refused, naming the
spec and the reason, when libvirt or QEMU would refuse them at every launch."""

from __future__ import annotations

import pytest

from loadmaster.errors import ValidationError
from loadmaster.quota import Quota, flavor_quota
from loadmaster.resources import parse_flavor


def test_quota_specs_map_to_libvirts_names_and_zero_is_no_limit() -> None:
    quota = flavor_quota(
        {
            "quota:disk_read_bytes_sec": "1048576",
            "quota:disk_write_bytes_sec": "0",
            "quota:disk_total_iops_sec": "500",
            "quota:disk_total_iops_sec_max": "800",
            "quota:disk_total_iops_sec_max_length": "10",
            "quota:vif_inbound_average": "1024",
            "quota:vif_inbound_peak": "2048",
            "quota:vif_outbound_average": "512",
            "quota:vif_outbound_burst": "64",
            "quota:cpu_shares": "2048",
            "quota:cpu_period": "0",
            "hw:cpu_policy": "shared",
        }
    )
    assert quota == Quota(
        disk={
            "read_bytes_sec": 1048576,
            "total_iops_sec": 500,
            "total_iops_sec_max": 800,
            "total_iops_sec_max_length": 10,
        },
        vif={
            "inbound.average": 1024,
            "inbound.peak": 2048,
            "outbound.average": 512,
            "outbound.burst": 64,
        },
        cpu={"shares": 2048},
    )
    assert Quota.from_dict(quota.to_dict()) == quota
    assert Quota.from_dict(None) == Quota() == flavor_quota({})


def test_a_negative_cpu_quota_is_novas_unlimited() -> None:
    assert flavor_quota({"quota:cpu_quota": "-1", "quota:cpu_shares": "512"}) == Quota(
        cpu={"shares": 512}
    )


@pytest.mark.parametrize(
    ("specs", "field", "reason"),
    [
        (
            {"quota:disk_total_bytes_sec": "1", "quota:disk_write_bytes_sec": "1"},
            "quota:disk_total_bytes_sec",
            "cannot be set with extra_specs.quota:disk_write_bytes_sec",
        ),
        (
            {"quota:disk_total_iops_sec": "100", "quota:disk_total_iops_sec_max": "50"},
            "quota:disk_total_iops_sec_max",
            "and at least its value",
        ),
        (
            {"quota:disk_write_bytes_sec_max_length": "5", "quota:disk_write_bytes_sec": "1"},
            "quota:disk_write_bytes_sec_max_length",
            "needs extra_specs.quota:disk_write_bytes_sec_max",
        ),
        (
            {"quota:vif_inbound_burst": "64", "quota:vif_outbound_average": "1"},
            "quota:vif_inbound_burst",
            "needs quota:vif_inbound_average",
        ),
        ({"quota:vif_inbound_average": str(2**32)}, "quota:vif_inbound_average", "to 4294967295"),
        ({"quota:cpu_quota": "-x"}, "quota:cpu_quota", "an integer of at least 0"),
        ({"quota:cpu_period": "-1"}, "quota:cpu_period", "an integer of at least 0"),
        ({"quota:cpu_shares": "20000"}, "quota:cpu_shares", "from 1 to 10000"),
        ({"quota:disk_total_bytes_sec": " 5"}, "quota:disk_total_bytes_sec", "integer"),
        ({"quota:disk_total_bytes": "5"}, "quota:disk_total_bytes", "not a quota"),
    ],
)
def test_bad_quota_refused_naming_the_spec(specs: dict[str, str], field: str, reason: str) -> None:
    definition = {"name": "f", "resources": {"VCPU": 1}, "extra_specs": specs}
    for unknown_specs in ("refuse", "warn"):  # a quota not applied is never only a warning
        with pytest.raises(ValidationError, match=reason) as err:
            parse_flavor(definition, unknown_specs)  # type: ignore[arg-type]
        assert err.value.field == f"extra_specs.{field}"
