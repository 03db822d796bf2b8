"""Nova's flavor quota extra specs: a VM's disk, NIC and CPU limits, as the API checks
them and the hosts' agents apply them.

``quota:disk_<read|write|total>_<bytes|iops>_sec`` (with ``_max`` and ``_max_length``)
become the ``<iotune>`` of the guest's disk, ``quota:vif_<inbound|outbound>_<average|peak|
burst>`` (KiB/s, burst KiB) the limits of each of its NICs, ``quota:cpu_<shares|period|
quota>`` its ``<cputune>``: Nova's libvirt driver's names and units. Every value is an
integer of at least 0; 0 is no limit (an element left out). The flavor's quota is the
VM's starting limit; the SLA policy's controllers change the live values while they act.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from loadmaster.errors import ValidationError

QUOTA_PREFIX = "quota:"
DISK_PREFIX = "disk_"
VIF_PREFIX = "vif_"
CPU_PREFIX = "cpu_"

_DISK_BASES = tuple(f"{d}_{m}_sec" for d in ("total", "read", "write") for m in ("bytes", "iops"))
# libvirt's <iotune> element names; the spec is ``quota:disk_<name>``.
DISK_KEYS = (
    *_DISK_BASES,
    *(f"{b}_max" for b in _DISK_BASES),
    *(f"{b}_max_length" for b in _DISK_BASES),
)
# libvirt's interface parameter names (``inbound.average``); the spec is
# ``quota:vif_inbound_average``.
VIF_KEYS = tuple(f"{d}.{p}" for d in ("inbound", "outbound") for p in ("average", "peak", "burst"))
# libvirt's <cputune> element names; the spec is ``quota:cpu_<name>``.
CPU_KEYS = ("shares", "period", "quota")

# (least non-zero value, largest value): QEMU's largest throttling value; libvirt's
# interface limits are unsigned ints; the CPU's as libvirt and the kernel take them, the
# shares as cgroup v2's cpu.weight, which libvirt writes them to there (v1 takes more).
_DISK_MAX = 10**15
_RANGES: Mapping[str, tuple[int, int]] = {
    **{f"{DISK_PREFIX}{k}": (1, _DISK_MAX) for k in DISK_KEYS},
    **{f"{VIF_PREFIX}{k.replace('.', '_')}": (1, 2**32 - 1) for k in VIF_KEYS},
    "cpu_shares": (1, 10000),
    "cpu_period": (1000, 1000000),
    "cpu_quota": (1000, 17592186044415),
}


@dataclass(frozen=True)
class Quota:
    """A flavor's quota, each part keyed by libvirt's names; only limits above 0."""

    disk: Mapping[str, int] = field(default_factory=dict)
    vif: Mapping[str, int] = field(default_factory=dict)
    cpu: Mapping[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, dict[str, int]]:
        """As a host's work list carries it (``from_dict`` reads it back)."""
        return {"disk": dict(self.disk), "vif": dict(self.vif), "cpu": dict(self.cpu)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, int]] | None) -> Quota:
        data = data or {}
        return cls(
            **{
                part: {str(k): int(v) for k, v in (data.get(part) or {}).items()}
                for part in ("disk", "vif", "cpu")
            }
        )


def is_quota_spec(key: str) -> bool:
    return key.startswith(QUOTA_PREFIX)


def check_quota_spec(key: str, value: str) -> int:
    """One ``quota:`` extra spec's value, or a ValidationError naming it and the reason."""
    where = f"extra_specs.{key}"
    name = key.removeprefix(QUOTA_PREFIX)
    bounds = _RANGES.get(name)
    if bounds is None:
        known = ", ".join(f"{QUOTA_PREFIX}{k}" for k in sorted(_RANGES) if "_max" not in k)
        raise ValidationError(
            f"{where} is not a quota loadmaster applies (it applies {known}, and the "
            "disk ones' _max and _max_length)",
            field=where,
        )
    if (
        name == "cpu_quota"
        and value.startswith("-")
        and value[1:].isascii()
        and value[1:].isdigit()
    ):
        # libvirt and Nova take a negative CPU quota as "unlimited": flavors copied from
        # Nova carry -1, which is no limit here too.
        return 0
    if not value.isascii() or not value.isdigit():
        raise ValidationError(
            f"{where} must be an integer of at least 0 (0: no limit), got {value!r}", field=where
        )
    amount = int(value)
    least, most = bounds
    if amount and not least <= amount <= most:
        raise ValidationError(
            f"{where} must be 0 (no limit) or from {least} to {most}, got {amount}", field=where
        )
    return amount


def flavor_quota(extra_specs: Mapping[str, str]) -> Quota:
    """The quota of a flavor's extra specs, checked as a whole: libvirt and QEMU refuse a
    total limit with a read or write one, a ``_max`` without its limit or below it, a
    ``_max_length`` without its ``_max``; refused here, naming the spec, rather than at
    every launch of the flavor's VMs."""
    disk: dict[str, int] = {}
    vif: dict[str, int] = {}
    cpu: dict[str, int] = {}
    for key, value in extra_specs.items():
        if not is_quota_spec(key):
            continue
        amount = check_quota_spec(key, value)
        name = key.removeprefix(QUOTA_PREFIX)
        if not amount:
            continue
        if name.startswith(DISK_PREFIX):
            disk[name.removeprefix(DISK_PREFIX)] = amount
        elif name.startswith(VIF_PREFIX):
            vif[name.removeprefix(VIF_PREFIX).replace("_", ".", 1)] = amount
        else:
            cpu[name.removeprefix(CPU_PREFIX)] = amount
    _check_disk(disk)
    for key in vif:
        average = key.split(".")[0] + ".average"
        if average not in vif:
            where = f"extra_specs.{QUOTA_PREFIX}{VIF_PREFIX}{key.replace('.', '_')}"
            raise ValidationError(
                f"{where} needs {QUOTA_PREFIX}{VIF_PREFIX}{average.replace('.', '_')} (libvirt "
                "ignores a peak or burst without its average)",
                field=where,
            )
    return Quota(disk, vif, cpu)


def _check_disk(disk: Mapping[str, int]) -> None:
    def spec(name: str) -> str:
        return f"extra_specs.{QUOTA_PREFIX}{DISK_PREFIX}{name}"

    for base in _DISK_BASES:
        direction, unit = base.split("_", 1)
        if direction == "total" and base in disk:
            clash = [f"{d}_{unit}" for d in ("read", "write") if f"{d}_{unit}" in disk]
            if clash:
                raise ValidationError(
                    f"{spec(base)} cannot be set with {spec(clash[0])} (a total limit or "
                    "read and write ones)",
                    field=spec(base),
                )
        peak, length = f"{base}_max", f"{base}_max_length"
        if peak in disk and (base not in disk or disk[peak] < disk[base]):
            raise ValidationError(
                f"{spec(peak)} needs {spec(base)}, and at least its value", field=spec(peak)
            )
        if length in disk and peak not in disk:
            raise ValidationError(f"{spec(length)} needs {spec(peak)}", field=spec(length))
