"""``Host`` and ``Guests`` as a policy sees them, built fresh from snapshots every cycle.

An entity shows its stats as attributes (``guest.balloon_cur``) and MOM's methods
(``Stat``, ``StatAvg``, ``Prop``, ``Control``, ``GetControl``, ``SetVar``, ``GetVar``)
plus loadmaster extensions: ``HasTag`` and ``Tags``, and the SLA tier the tags give
(``loadmaster.tiers``): ``Tier``, ``Priority`` and ``MemoryGuarantee``. Every stat read that comes back
nil is remembered, so the cycle result can say which stats a policy wanted but did not get.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from loadmaster.policy.snapshot import EntitySnapshot, StatValue
from loadmaster.policy.values import MISSING, Builtin, Exposed, Fault, Value, describe
from loadmaster.tiers import priority_of, tier_of

# The fields MOM's collectors declare. A declared field a snapshot lacks reads as nil
# (MOM's "optional field not collected"); a name that is neither declared here nor
# present in any snapshot is an undefined symbol, which catches typos in policies.
HOST_MEMORY_STATS = (
    "mem_available",
    "mem_unused",
    "mem_free",
    "anon_pages",
    "swap_total",
    "swap_usage",
    "swap_in",
    "swap_out",
)
HOST_TIME_STATS = (
    "time_year",
    "time_month",
    "time_day",
    "time_hour",
    "time_minute",
    "time_second",
    "time_microsecond",
)
HOST_STATS = frozenset(
    {
        *HOST_MEMORY_STATS,
        "ksm_run",
        "ksm_sleep_millisecs",
        "ksm_pages_shared",
        "ksm_pages_sharing",
        "ksm_pages_unshared",
        "ksm_pages_to_scan",
        "ksm_pages_volatile",
        "ksm_full_scans",
        "ksm_merge_across_nodes",
        "ksm_shareable",
        "ksmd_cpu_usage",
        "cpu_count",
        *HOST_TIME_STATS,
    }
)
GUEST_STATS = frozenset(
    {
        "mem_available",
        "mem_unused",
        "mem_free",
        "major_fault",
        "minor_fault",
        "swap_in",
        "swap_out",
        "swap_total",
        "swap_usage",
        "balloon_cur",
        "balloon_max",
        "balloon_min",
        "vcpu_quota",
        "vcpu_period",
        "vcpu_user_limit",
        "vcpu_count",
        "host_minor_faults",
        "host_major_faults",
        "rss",
    }
)

# The six IO limits MOM's IoTune objects carry; libvirt uses the same names.
IO_KEYS = (
    "total_bytes_sec",
    "read_bytes_sec",
    "write_bytes_sec",
    "total_iops_sec",
    "read_iops_sec",
    "write_iops_sec",
)

_CONTROL_TYPES = (int, float, str)


def declared_stats(known: frozenset[str], snapshots: Sequence[EntitySnapshot]) -> frozenset[str]:
    """The attribute names entities of one kind answer when the snapshots carry no
    declaration of their own: MOM's fields plus any collected."""
    names = set(known)
    for snap in snapshots:
        names.update(snap.stats)
        for sample in snap.history:
            names.update(sample)
    return frozenset(names)


def io_tune_problem(raw: object) -> str | None:
    """Why an ``io_tune`` property cannot be used, or None when it can.

    A limit key a ``maximum`` or ``guaranteed`` object lacks is no problem here: as in
    MOM, it matters only if the policy reads it (``IoLimits``), so a policy that lifts
    every limit without reading them (IO tuning switched off) still clears them. A value
    may be null ("no limit"); ``current`` is the device's state and may lack keys.
    """
    if not isinstance(raw, list | tuple):
        return f"io_tune must be a list of entries, got {type(raw).__name__}"
    for index, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            return f"io_tune entry {index} is not an object"
        label = f"io_tune entry {entry.get('name') or index!r}"
        for part in ("guaranteed", "maximum", "current"):
            limits = entry.get(part)
            if limits is None:
                continue
            if not isinstance(limits, Mapping):
                return f"{label}: {part} is not an object"
            for key in IO_KEYS:
                value = limits.get(key)
                if value is not None and (
                    isinstance(value, bool)
                    or not isinstance(value, int | float)
                    or not math.isfinite(value)
                    or value < 0
                ):
                    return f"{label}: {part}.{key} is not a non-negative number"
    return None


class Entity(Exposed):
    __slots__ = (
        "_averages",
        "_methods",
        "controls",
        "declared",
        "io_tune",
        "io_tune_refused",
        "missing",
        "snapshot",
        "variables",
    )

    def __init__(
        self,
        snapshot: EntitySnapshot,
        declared: frozenset[str],
        io_tune_refused: str | None = None,
    ) -> None:
        """``io_tune_refused``: why an earlier evaluation of the cycle refused its IO tune."""
        self.snapshot = snapshot
        self.declared = declared
        self.controls: dict[str, Value] = {}
        self.variables: dict[str, Value] = {}
        self.missing: set[str] = set()
        self._averages: dict[str, float] = {}
        self._methods: dict[str, Builtin] = {}
        raw = snapshot.properties.get("io_tune")
        self.io_tune_refused = io_tune_refused or (None if raw is None else io_tune_problem(raw))
        # A refused IO policy reads as none at all: the guest's other rules still run.
        self.io_tune: list[IoTune] | None = (
            None
            if raw is None or self.io_tune_refused is not None
            else [IoTune.from_mapping(entry, index) for index, entry in enumerate(raw)]
        )

    def __repr__(self) -> str:
        return f"<entity {self.snapshot.name}>"

    def attribute(self, name: str) -> Value:
        method = self._methods.get(name)
        if method is not None:
            return method
        if name in _METHODS:
            min_args, max_args, fn_name = _METHODS[name]
            method = Builtin(
                f"{self.snapshot.name}.{name}", getattr(self, fn_name), min_args, max_args
            )
            self._methods[name] = method
            return method
        if name == "io_tune":
            # Absent IO-tune data means "no IO policy for this VM", not a failed collector,
            # so it is nil without being reported missing.
            return self.io_tune
        if name in self.declared:
            return self._stat(name)
        return MISSING

    def _stat(self, name: str) -> StatValue:
        value = self.snapshot.stats.get(name)
        if value is None:
            self.missing.add(name)
        return value

    def _check_declared(self, name: Value) -> str:
        if not isinstance(name, str):
            raise Fault(f"stat name must be a string, got {describe(name)}")
        if name not in self.declared:
            raise Fault(f"{self.snapshot.name} has no stat {name!r}")
        return name

    def _m_stat(self, name: Value) -> Value:
        return self._stat(self._check_declared(name))

    def _m_stat_avg(self, name: Value) -> Value:
        field = self._check_declared(name)
        cached = self._averages.get(field)
        if cached is not None:
            return cached
        samples = self.snapshot.history or (self.snapshot.stats,)
        values = [s[field] for s in samples if s.get(field) is not None]
        if not values:
            self.missing.add(field)
        try:
            average = float(sum(values)) / len(values) if values else 0.0  # type: ignore[arg-type]
        except (TypeError, OverflowError) as exc:
            raise Fault(f"cannot average stat {field!r}: {exc}") from None
        self._averages[field] = average
        return average

    def _m_prop(self, name: Value) -> Value:
        if name == "name":
            return self.snapshot.name
        if not isinstance(name, str):
            raise Fault(f"property name must be a string, got {describe(name)}")
        value: Value = self.snapshot.properties.get(name)
        return value

    def _m_control(self, name: Value, value: Value) -> Value:
        if not isinstance(name, str):
            raise Fault(f"control name must be a string, got {describe(name)}")
        if name == "io_tune":
            raise Fault(
                "io_tune is not set with Control; call the setters of guest.io_tune entries"
            )
        if value is not None and not isinstance(value, _CONTROL_TYPES):
            raise Fault(f"control {name!r} must be a number, string or nil, got {describe(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise Fault(f"control {name!r} is not a finite number: {value}")
        self.controls[name] = value
        return None

    def _m_get_control(self, name: Value) -> Value:
        if not isinstance(name, str):
            raise Fault(f"control name must be a string, got {describe(name)}")
        return self.controls.get(name)

    def _m_set_var(self, name: Value, value: Value) -> Value:
        if not isinstance(name, str):
            raise Fault(f"variable name must be a string, got {describe(name)}")
        self.variables[name] = value
        return None

    def _m_get_var(self, name: Value) -> Value:
        if not isinstance(name, str):
            raise Fault(f"variable name must be a string, got {describe(name)}")
        return self.variables.get(name)

    def _m_has_tag(self, tag: Value) -> Value:
        if not isinstance(tag, str):
            raise Fault(f"tag must be a string, got {describe(tag)}")
        return tag in self.snapshot.tags

    def _m_tags(self) -> Value:
        return sorted(self.snapshot.tags)

    def _m_tier(self) -> Value:
        return tier_of(self.snapshot.tags).name

    def _m_priority(self) -> Value:
        return priority_of(self.snapshot.tags)

    def _m_memory_guarantee(self) -> Value:
        return tier_of(self.snapshot.tags).memory_guarantee

    def io_tune_absent_read(self) -> str | None:
        """A limit key the policy read that this guest's IO policy lacks, as a refusal."""
        for tune in self.io_tune or ():
            reason = tune.absent_read()
            if reason is not None:
                return reason
        return None

    def io_tune_control(self) -> list[dict[str, Any]] | None:
        """MOM's IoTune controller input: the entries whose current limits the policy changed."""
        if self.io_tune is None:
            return None
        changed = [t.as_request() for t in self.io_tune if t.changed()]
        return changed or None


# name -> (min args, max args, implementing method)
_METHODS: dict[str, tuple[int, int, str]] = {
    "Stat": (1, 1, "_m_stat"),
    "StatAvg": (1, 1, "_m_stat_avg"),
    "Prop": (1, 1, "_m_prop"),
    "Control": (2, 2, "_m_control"),
    "GetControl": (1, 1, "_m_get_control"),
    "SetVar": (2, 2, "_m_set_var"),
    "GetVar": (1, 1, "_m_get_var"),
    "HasTag": (1, 1, "_m_has_tag"),
    "Tags": (0, 0, "_m_tags"),
    "Tier": (0, 0, "_m_tier"),
    "Priority": (0, 0, "_m_priority"),
    "MemoryGuarantee": (0, 0, "_m_memory_guarantee"),
}


class IoLimits(Exposed):
    """One set of IO limits (``tune.maximum``); the six MOM keys, nil when not given.

    ``label`` names a policy's limits (``maximum``, ``guaranteed``): a key they lack fails
    when the policy reads it, as MOM's KeyError does, and ``absent_read`` says which, so
    the cycle can refuse that guest's IO tune alone. ``current`` (no label) is the
    device's state, where a lacking key reads nil.
    """

    __slots__ = ("absent", "absent_read", "label", "values")

    def __init__(self, values: Mapping[str, Any] | None, label: str | None = None) -> None:
        self.values: dict[str, Value] = {k: (values or {}).get(k) for k in IO_KEYS}
        self.label = label
        self.absent = frozenset(
            () if values is None or label is None else (k for k in IO_KEYS if k not in values)
        )
        self.absent_read: str | None = None

    def attribute(self, name: str) -> Value:
        if name in self.absent:
            self.absent_read = f"{self.label} lacks the limit key {name}, which the policy read"
            raise Fault(self.absent_read)
        return self.values.get(name, MISSING)

    def __repr__(self) -> str:
        return f"<io limits {self.values}>"


# MOM's setter of each limit: total_bytes_sec -> setTotalBytesSec.
_SETTERS = {"set" + "".join(part.title() for part in key.split("_")): key for key in IO_KEYS}


class IoTune(Exposed):
    """One disk's IO-tune policy; its setters change ``current`` like MOM's IoTune objects."""

    __slots__ = ("_original", "current", "guaranteed", "maximum", "name", "path")

    def __init__(
        self,
        name: str,
        path: str | None,
        guaranteed: IoLimits,
        maximum: IoLimits,
        current: IoLimits,
    ) -> None:
        self.name = name
        self.path = path
        self.guaranteed = guaranteed
        self.maximum = maximum
        self.current = current
        self._original = dict(current.values)

    @classmethod
    def from_mapping(cls, entry: Mapping[str, Any], index: int) -> IoTune:
        label = f"io_tune entry {entry.get('name') or index!r}"
        return cls(
            str(entry.get("name", "")),
            entry.get("path"),
            IoLimits(entry.get("guaranteed"), f"{label}: guaranteed"),
            IoLimits(entry.get("maximum"), f"{label}: maximum"),
            IoLimits(entry.get("current")),
        )

    def absent_read(self) -> str | None:
        """Why this entry cannot be applied: a limit key the policy read and it lacks."""
        return self.maximum.absent_read or self.guaranteed.absent_read

    def attribute(self, name: str) -> Value:
        if name in ("name", "path", "guaranteed", "maximum", "current"):
            value: Value = getattr(self, name)
            return value
        key = _SETTERS.get(name)
        if key is None:
            return MISSING
        return Builtin(name, lambda v: self._set(key, v), 1, 1)

    def _set(self, key: str, value: Value) -> Value:
        if value is not None:
            try:
                value = int(value)  # type: ignore[call-overload]
            except (TypeError, ValueError, OverflowError) as exc:
                raise Fault(f"IO limit {key} needs an integer: {exc}") from None
        self.current.values[key] = value
        return None

    def changed(self) -> bool:
        return self.current.values != self._original

    def as_request(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "ioTune": dict(self.current.values)}

    def __repr__(self) -> str:
        return f"<io_tune {self.name}>"
