"""Collectors: read the host and its guests into the stats a policy sees, one concern a
module (``memory``, ``cpu``, ``ksm``, ``io``, ``net``, ``numa``, ``time``; ``mom`` has
MOM's collectors under MOM's names, ``simulated`` the simulated host's).

A collector declares the ``fields`` it provides and, as MOM's do, which of them are
mandatory (``mandatory_fields``, a subset; absent = none). A field it cannot read comes
back ``None``; a collector that raises is reported by the agent with all its fields
``None``. A sample lacking a mandatory field makes its entity not ready for the cycle
(``Declaration``, used by ``loop.Agent``). Host collectors also see this cycle's guest
stats, for host figures that summarise guests (``ksm_shareable``).

The agent's configuration picks collectors by MOM's names (``HostMemory``,
``GuestCpuTune``, ...) or a whole set by name (``COLLECTOR_SETS``: ``vdsm``,
``mom-libvirt``, ``loadmaster``, the default); each is a factory registered by entry
point (``loadmaster.agent.sla.plugins``). A MOM-named collector declares exactly MOM's
mandatory and optional fields, so the fields a policy can read are MOM's.
"""

from loadmaster.agent.sla.collectors.base import (
    PROPERTY_FIELDS,
    CollectorSources,
    GuestCollector,
    HostCollector,
    Stats,
)
from loadmaster.agent.sla.collectors.declaration import Declaration
from loadmaster.agent.sla.collectors.history import DEFAULT_HISTORY, History
from loadmaster.agent.sla.collectors.sets import (
    COLLECTOR_SETS,
    CollectorSet,
    collector_selection,
    declarations,
    default_guest_collectors,
    default_host_collectors,
    named_collectors,
)

__all__ = [
    "COLLECTOR_SETS",
    "DEFAULT_HISTORY",
    "PROPERTY_FIELDS",
    "CollectorSet",
    "CollectorSources",
    "Declaration",
    "GuestCollector",
    "History",
    "HostCollector",
    "Stats",
    "collector_selection",
    "declarations",
    "default_guest_collectors",
    "default_host_collectors",
    "named_collectors",
]
