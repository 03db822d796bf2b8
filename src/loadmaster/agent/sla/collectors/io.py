"""IO: a guest's bytes read and written, and its IO tune."""

from __future__ import annotations

from typing import Any

from loadmaster.agent.hypervisor.base import GuestInfo, Hypervisor
from loadmaster.agent.sla.collectors.base import CollectorSources, GuestCollector, Stats


class GuestIoCollector:
    """Bytes read and written over all disks, and MOM's ``io_tune`` property for the disks
    that have an IO policy (maximum limits from the guest's metadata)."""

    name = "guest-io"
    fields: tuple[str, ...] = ("io_read_bytes", "io_write_bytes")

    def __init__(self, hypervisor: Hypervisor) -> None:
        self.hypervisor = hypervisor

    def collect(self, guest: GuestInfo) -> tuple[Stats, dict[str, Any]]:
        read = written = 0
        for disk in guest.disks:
            block = self.hypervisor.block_stats(guest.uuid, disk)
            read += block.rd_bytes
            written += block.wr_bytes
        properties: dict[str, Any] = {}
        if guest.io_limits:
            properties["io_tune"] = [
                {
                    "name": disk,
                    "path": None,
                    "maximum": dict(maximum),
                    "current": dict(self.hypervisor.io_tune(guest.uuid, disk)),
                }
                for disk, maximum in guest.io_limits.items()
            ]
        return {"io_read_bytes": read, "io_write_bytes": written}, properties


def guest_io(src: CollectorSources) -> GuestCollector:
    return GuestIoCollector(src.hypervisor)
