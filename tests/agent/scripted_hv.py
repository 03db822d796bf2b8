"""A hypervisor that answers exactly the samples a test scripts, field by MOM field.

A guest sample is a mapping of MOM field names (``balloon_cur``, ``vcpu_count``, ...) to
values; a field left out of the mapping is one the hypervisor cannot give this cycle
(the guest is booting, its agent died). ``io_max`` holds the maximum limits of the
guest's IO policy per disk. Every call that changes something is recorded in ``calls``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from loadmaster.agent.hypervisor.base import (
    BalloonInfo,
    BlockStats,
    CpuStats,
    CpuTune,
    GuestInfo,
    MemoryKsm,
)
from loadmaster.policy.entities import IO_KEYS

Sample = Mapping[str, Any]

# libvirt's memory-stats names for MOM's guest memory fields.
_MEMORY_NAMES = {
    "mem_available": "available",
    "mem_unused": "unused",
    "mem_free": "usable",
    "major_fault": "major_fault",
    "minor_fault": "minor_fault",
    "swap_in": "swap_in",
    "swap_out": "swap_out",
}
# A fresh kernel's knobs, after a few scans.
KSM = {**MemoryKsm().values, "full_scans": 3}


def _maybe(value: Any) -> Any:
    # The hypervisor's records are typed for complete data; None is what a collector
    # sees from a source that could not answer.
    return cast(Any, value)


@dataclass
class ScriptedHypervisor:
    """``samples`` maps a guest name to its sample for the current cycle."""

    samples: dict[str, Sample] = field(default_factory=dict)
    io_max: dict[str, Mapping[str, Mapping[str, int]]] = field(default_factory=dict)
    calls: list[tuple[str, str, Any]] = field(default_factory=list)

    def _sample(self, uuid: str) -> Sample:
        return self.samples[uuid.removeprefix("uuid-")]

    def list_guests(self) -> list[GuestInfo]:
        return [
            GuestInfo(
                uuid=f"uuid-{name}",
                name=name,
                vcpu_user_limit=_maybe(sample.get("vcpu_user_limit")),
                disks=tuple(self.io_max.get(name, {})),
                io_limits=self.io_max.get(name, {}),
            )
            for name, sample in sorted(self.samples.items())
        ]

    def memory_stats(self, uuid: str) -> Mapping[str, int]:
        sample = self._sample(uuid)
        return {libvirt: sample[mom] for mom, libvirt in _MEMORY_NAMES.items() if mom in sample}

    def balloon_info(self, uuid: str) -> BalloonInfo:
        sample = self._sample(uuid)
        return BalloonInfo(
            _maybe(sample.get("balloon_cur")),
            _maybe(sample.get("balloon_max")),
            _maybe(sample.get("balloon_min")),
        )

    def set_memory(self, uuid: str, kib: int) -> None:
        self.calls.append(("set_memory", uuid, kib))

    def cpu_stats(self, uuid: str) -> CpuStats:
        return CpuStats(0, _maybe(self._sample(uuid).get("vcpu_count")))

    def cpu_tune(self, uuid: str) -> CpuTune:
        sample = self._sample(uuid)
        return CpuTune(sample.get("vcpu_quota"), sample.get("vcpu_period"), None)

    def set_cpu_tune(
        self, uuid: str, *, quota: int | None, period: int | None, shares: int | None
    ) -> None:
        self.calls.append(("set_cpu_tune", uuid, (quota, period)))

    def block_stats(self, uuid: str, disk: str) -> BlockStats:
        return BlockStats(0, 0, 0, 0)

    def io_tune(self, uuid: str, disk: str) -> Mapping[str, int]:
        return dict.fromkeys(IO_KEYS, 0)

    def set_io_tune(self, uuid: str, disk: str, limits: Mapping[str, int]) -> None:
        self.calls.append(("set_io_tune", uuid, (disk, dict(limits))))

    def stop_guest(self, uuid: str, *, force: bool) -> None:
        self.calls.append(("stop_guest", uuid, force))

    def ksm_read(self) -> Mapping[str, int | None]:
        return dict(KSM)

    def ksm_write(self, key: str, value: int) -> None:
        self.calls.append(("ksm_write", key, value))
