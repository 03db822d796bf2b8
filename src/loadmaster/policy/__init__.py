"""A MOM-compatible policy language: vdsm's ``mom.d`` policies run here unchanged.

Public API::

    PolicyError(file, line, column, message)      # str: "02-balloon.policy:12:5: undefined symbol foo"
    parse(text, filename="<policy>") -> tuple[Node, ...]
    Policy.evaluate(host: EntitySnapshot, guests: Sequence[EntitySnapshot]) -> CycleResult
    Policy.from_text(text, filename="policy.policy") -> Policy
    load_policy_files(paths) -> Policy           # run in MOM name order (file name cut at ".policy")
    load_policy_dir(path) -> Policy              # MOM's policy-dir rule: *.policy, dot-files skipped
    shipped_policy_dir() -> Path
    check_files(paths) -> list[PolicyError]      # syntax + shape problems, every file checked
    eval_files(paths, snapshot_json) -> dict     # one cycle on a JSON snapshot, JSON-able result

A cycle is all-or-nothing, as in MOM: ``evaluate`` either returns every control the
policy recorded or raises ``PolicyError`` and nothing is applied. Language details and
the few deliberate differences from MOM are in ``evaluator`` and ``syntax``.

Loadmaster extensions to MOM's entity API: ``(e.HasTag "gold")`` is true when the
entity carries that tag; ``(e.Tags)`` is the sorted list of its tags. The SLA tier its
tags give (``loadmaster.tiers``): ``(e.Tier)`` is "platinum", "gold", "silver",
"compute", "vapor" (tag ``best-effort`` too) or "none"; ``(e.MemoryGuarantee)`` the
fraction of its allocation the tier guarantees (1, 0.75, 0.5, 0); ``(e.Priority)`` the N
of its ``priority:N`` tag, 0 without one. ``(e.Prop "name")`` is always the entity's
name; other properties are nil when absent.

Snapshot JSON (``eval_files``; the CLI's ``policy eval --snapshot``)::

    {
      "host": {
        "name": "host-1",                                   # optional, default "host"
        "stats": {"mem_available": 67108864, "mem_free": 8388608, ...},
        "history": [{"mem_free": 8000000}, ...],            # oldest first, latest included;
                                                            # StatAvg uses it (default: [stats])
        "properties": {"interval": 15},
        "tags": []
      },
      "guests": [
        {
          "name": "vm-1",                                   # required, unique
          "stats": {"balloon_cur": 4194304, "mem_unused": 1048576, ...},
          "history": [...],
          "properties": {"uuid": "...", "io_tune": [        # io_tune: optional, see below
             {"name": "vda", "path": "/dev/vda",
              "guaranteed": {"total_bytes_sec": 0, ...},
              "maximum": {"total_bytes_sec": 10485760, ...},
              "current": {"total_bytes_sec": 0, ...}}]},
          "tags": ["gold", "compute"]
        }
      ]
    }

Stat values are finite numbers or null (null = the collector could not read it). The
io_tune limit objects use MOM's six keys: total/read/write_bytes_sec, total/read/write_iops_sec.
The policy reading a key a ``maximum`` or ``guaranteed`` object lacks refuses that guest's
IO tune (it is listed under ``refused``; the rest of the cycle runs); a key never read is
no problem, as in MOM. Every field MOM's collectors
know is readable here; the agent narrows that to its configured collectors'
(``EntitySnapshot.declared``).

Result JSON::

    {"host": {"ksm_run": 1, ...},
     "guests": {"vm-1": {"balloon_target": 3984588.8, ...}},   # only guests with controls
     "missing_stats": {"host": [...], "guests": {"vm-2": ["mem_unused"]}},
     "left_out": {"vm-3": "policy failed on its nil vcpu_count: ..."},  # see Policy.evaluate
     "refused": {"vm-4": {"io_tune": "io_tune entry 'vda': maximum lacks ..."}}}

Control values are raw policy numbers (often floats); the controllers truncate with
``int()`` as MOM's do. ``io_tune`` is MOM's IoTune request: a list of
``{"name", "path", "ioTune": {six keys}}`` for the disks whose limits the policy changed.

Shipped policies (``shipped_policy_dir()``), what the agent's collectors must provide:

- host stats: ``mem_available`` (KiB total), ``mem_free`` (KiB free incl. buffers and
  cache; its history feeds StatAvg), ``ksm_shareable``, ``ksm_pages_shared``,
  ``ksm_pages_to_scan``, ``ksm_merge_across_nodes``, ``cpu_count``;
- guest stats: ``balloon_cur``, ``balloon_max`` (the VM's allocation), ``balloon_min``
  (all KiB), ``mem_unused`` (KiB, from the guest agent; history used), ``vcpu_quota``,
  ``vcpu_period`` (µs), ``vcpu_user_limit`` (%, 100 = unlimited), ``vcpu_count``;
- guest properties: ``io_tune`` (optional); guest tags: the tiers ``platinum``, ``gold``,
  ``silver``, ``compute``, ``vapor`` (or ``best-effort``), and ``priority:N``.

A guest lacking a stat a rule needs is skipped by that rule (the policies test with
``valid`` first) and the stat is listed under ``missing_stats``; a host lacking memory
stats is treated as under no pressure and KSM is left alone.

Controls written: host ``ksm_run`` (0 stop, 1 run, 2 unmerge), ``ksm_pages_to_scan``,
``ksm_sleep_millisecs``, ``ksm_merge_across_nodes``; guest ``balloon_target`` (KiB),
``vcpu_quota``, ``vcpu_period`` (µs, -1 quota = unlimited), ``io_tune``; network
bandwidth per interface ``net_inbound_average``, ``net_inbound_peak``,
``net_inbound_burst``, ``net_outbound_average``, ``net_outbound_peak``,
``net_outbound_burst`` (KiB/s, bursts KiB, 0 = no limit; ``<control>@<interface>`` for
one interface, see ``06-nettune``); NUMA placement ``numa_mode`` ("strict",
"preferred", "interleave", "restrictive") and ``numa_nodeset`` ("0-1", see
``07-numatune``); and loadmaster's requests for low tiers: ``migrate`` = 1 (move this VM
to another host) and ``stop`` = 1 (power this vapor VM off). ``06-nettune`` and
``07-numatune`` are examples, inert until ``netTuneEnabled`` / ``numaTuneEnabled`` are
set.

SLA tiers (``10-sla-tiers.policy``, needs ``02-balloon``): a platinum VM's balloon
target is never below ``balloon_max``; gold never below 75 % and silver 50 % of it (nor
below ``balloon_min``); a VM already below its floor is given the floor back. Vapor
VMs may go down to ``balloon_min``; when host free memory is below ``pressure_threshold``
(20 %) they get ``migrate``, at or below ``pressure_critical`` (5 %) also ``stop`` (the
agent then stops them without asking to move them), and silver VMs get ``migrate`` once
no vapor VM is left. ``compute`` VMs always get an
unlimited CPU quota, and under pressure are ballooned twice as fast, keeping only 5 %
free. Several tier tags: the strongest wins. Within a tier lower priority goes first:
while some VMs of a tier are shrunk, those of a higher priority keep their memory, and
only the lowest-priority VMs of a tier are asked to migrate or stop in a cycle.
"""

from loadmaster.policy.engine import (
    Policy,
    load_policy_dir,
    load_policy_files,
    shipped_policy_dir,
)
from loadmaster.policy.errors import PolicyError
from loadmaster.policy.jsonio import check_files, eval_files
from loadmaster.policy.snapshot import CycleResult, EntitySnapshot
from loadmaster.policy.syntax import parse

__all__ = [
    "CycleResult",
    "EntitySnapshot",
    "Policy",
    "PolicyError",
    "check_files",
    "eval_files",
    "load_policy_dir",
    "load_policy_files",
    "parse",
    "shipped_policy_dir",
]
