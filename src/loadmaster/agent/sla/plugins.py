"""The SLA loop's extension points, found by entry point as the scheduler's filters are,
and as MOM loads its collectors and controllers by name.

Each entry names a factory: a collector factory takes ``CollectorSources`` and returns a
host or guest collector; a controller factory takes ``ControllerSources`` and returns a
``Controller``, or None where it does not apply (no migration sender, say). A third party
adds one in its own pyproject, without touching loadmaster::

    [project.entry-points."loadmaster.guest_collectors"]
    gpu-temp = "mypkg.collectors:gpu_temperature"

    [project.entry-points."loadmaster.controllers"]
    cpufreq = "mypkg.controllers:CpuFreqController.build"

A collector runs when the agent's collector selection names it; every registered
controller runs. The hypervisor drivers are registered the same way
(``loadmaster.agent.hypervisor.registry``).
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

HOST_COLLECTOR_GROUP = "loadmaster.host_collectors"
GUEST_COLLECTOR_GROUP = "loadmaster.guest_collectors"
CONTROLLER_GROUP = "loadmaster.controllers"


def registered(group: str) -> dict[str, EntryPoint]:
    """The entries of one group by name (loaded only when used)."""
    return {ep.name: ep for ep in entry_points(group=group)}
