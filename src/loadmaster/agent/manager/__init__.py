"""The host's manager: registers the host, then makes its hypervisor match the host's
work list (launch, migrate in and out, remove what left), as vdsm and nova-compute do.
``ManagerConfig`` is the host's config file (``loadmaster agent --config``)."""

from loadmaster.agent.manager.host_manager import HostManager, ManagerConfig

__all__ = ["HostManager", "ManagerConfig"]
