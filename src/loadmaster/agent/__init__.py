"""The host agent: the host's manager and its SLA loop, over one hypervisor.

- ``loadmaster.agent.manager``: ``HostManager`` registers the host with the inventory it
  discovers and makes the hypervisor match the host's work list (launches, migrations,
  removals), as vdsm does for oVirt and nova-compute for Nova.
- ``loadmaster.agent.sla``: ``Agent``, the SLA loop MOM runs for oVirt: each interval its
  collectors read the host and guests, the policy (``loadmaster.policy``, hot-reloaded
  from a directory) decides controls, and its controllers apply them (balloon, KSM, CPU
  tune, IO tune, network bandwidth, NUMA placement, stopping vapor VMs, asking the
  scheduler to migrate VMs); applied controls are journalled and usage is reported to
  the API. Collectors and controllers are entry-point plugins.
- ``loadmaster.agent.hypervisor``: the ``Hypervisor`` protocol both use, its value types,
  the driver registry (``loadmaster.hypervisors``) and the drivers: ``libvirt`` and
  ``simulated`` (demos, benchmarks, tests).

``run_agent`` (``loadmaster agent``) is the one place that runs the two together: with
an API it starts the manager's thread beside the loop, without one only the loop runs.
The demo's simulated host is ``loadmaster.demo.simulation``; evaluating a policy offline
against a snapshot is ``loadmaster.policy.offline``.

Public API::

    run_agent(hypervisor_uri, policy_dir, interval, api_url, token, host_name, cycles,
              state_dir=None, sys_root=None, config_file=None, collectors=None,
              guest_image=None, migration_data_uri=None, storage=None, on_cycle=None,
              driver=None, tls=None) -> list[CycleReport]
"""

from loadmaster.agent.runner import run_agent

__all__ = ["run_agent"]
