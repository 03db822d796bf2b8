"""The agent: collect, evaluate the policy, apply its controls, report; once per interval.

A cycle is all-or-nothing as in MOM: if the policy raises, no controller runs. Unlike
MOM, a failing controller, collector or reporter never stops the agent: it is logged
and listed in that cycle's ``CycleReport``. With a journal, the controller phase of each
cycle is framed in it and every action recorded as soon as its call succeeded.

Incomplete samples are handled as MOM's monitors do: a guest whose sample lacks a field
its collectors declare mandatory is not ready and is left out of ``Guests`` for the
cycle, and its sample is not kept for ``StatAvg``. A host sample lacking a mandatory
field skips the whole tick (no controller runs, nothing on the host changes) until a
complete sample arrives. Every guest left out and every control not applied is listed
with its reason in the ``CycleReport`` and the journal.

The policy is its directory's, reloaded when a file changes (``PolicyWatcher``): a file
that does not parse is reported and the others run, keeping that file's previous version.
A file whose version exceeds an evaluation bound (steps, memory, wall time) is rejected at
run time and the cycle is evaluated again with that file's previous version.

This module runs the agent's policy cycle.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from loadmaster.agent.hypervisor.base import GuestInfo, Hypervisor
from loadmaster.agent.sla.collectors import (
    DEFAULT_HISTORY,
    PROPERTY_FIELDS,
    CollectorSet,
    CollectorSources,
    Declaration,
    GuestCollector,
    History,
    HostCollector,
    Stats,
    default_guest_collectors,
    default_host_collectors,
    named_collectors,
)
from loadmaster.agent.sla.controllers import (
    Action,
    ControlContext,
    Controller,
    Failure,
    MigrationSender,
    default_controllers,
)
from loadmaster.agent.sla.journal import AppliedJournal, JournalError
from loadmaster.agent.sla.policy_watch import PolicyLoader, PolicyWatcher
from loadmaster.policy import PolicyError
from loadmaster.policy.errors import PolicyLimitError
from loadmaster.policy.snapshot import CycleResult, EntitySnapshot

log = logging.getLogger(__name__)

Reporter = Callable[[str, dict[str, Any]], None]
"""``(host_name, payload)`` for ``POST /hosts/{host_name}/report``; raises on failure."""


@runtime_checkable
class _RemembersGuests(Protocol):
    def forget(self, uuids: set[str]) -> None: ...


@dataclass(frozen=True)
class NotApplied:
    """A control the cycle did not apply and why; ``control`` "*" means all of the target's
    (``target`` "*": every target, when the policy failed)."""

    target: str
    control: str
    reason: str
    uuid: str | None = None


@dataclass
class CycleReport:
    """What one cycle saw and did. ``missing_stats`` are ``entity.stat`` names that came back
    ``None``; ``policy_error`` means no controller ran; ``rejected_policy`` means policy files
    failed to load (or exceeded a bound) and their previous versions kept running.

    ``left_out`` maps each guest not given to the policy (not ready) to the reason;
    ``host_not_ready`` is why the tick was skipped; ``not_applied`` lists every control
    that was not applied, with its reason; ``policy_file_errors`` has one entry per
    refused policy file, ``file:line:col: message``."""

    cycle: int
    guests: int = 0
    host_controls: Mapping[str, Any] = field(default_factory=dict)
    guest_controls: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    actions: list[Action] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    missing_stats: list[str] = field(default_factory=list)
    policy_error: str | None = None
    rejected_policy: str | None = None
    policy_reloaded: bool = False
    reported: bool = False
    duration_s: float = 0.0
    left_out: dict[str, str] = field(default_factory=dict)
    host_not_ready: str | None = None
    not_applied: list[NotApplied] = field(default_factory=list)
    policy_file_errors: list[str] = field(default_factory=list)


class Agent:
    def __init__(
        self,
        hypervisor: Hypervisor,
        policy_dir: Path,
        interval: float = 10.0,
        host_collectors: Sequence[HostCollector] | None = None,
        guest_collectors: Sequence[GuestCollector] | None = None,
        controllers: Sequence[Controller] | None = None,
        reporter: Reporter | None = None,
        *,
        host_name: str = "localhost",
        migration_sender: MigrationSender | None = None,
        proc_root: Path = Path("/proc"),
        history_length: int = DEFAULT_HISTORY,
        report_every: int = 1,
        policy_loader: PolicyLoader | None = None,
        clock: Callable[[], float] = time.monotonic,
        journal: AppliedJournal | None = None,
        report_context: Callable[[], Mapping[str, Any]] | None = None,
        collectors: str | CollectorSet | None = None,
    ) -> None:
        """``collectors`` picks the collectors by name: a set (``"vdsm"``,
        ``"mom-libvirt"``) or a ``CollectorSet`` of MOM collector names; it cannot be
        combined with explicit ``host_collectors``/``guest_collectors``. Without either,
        the default set. Raises ``ValueError`` for an unknown name."""
        self.hypervisor = hypervisor
        # Taken just before the guests are listed and sent with the report: the host
        # manager's sequence and the VMs it is launching (see ``HostManager``).
        self.report_context = report_context
        # The journal is written, never read back to decide what to apply: the controllers
        # start from the values sampled from the hypervisor, journal or not. A kill between
        # a hypervisor call and its journal record leaves the hypervisor one call ahead of
        # the journal; the reverse cannot happen (records follow calls), so the hypervisor
        # is the only one of the two that is never stale.
        self.journal = journal
        self.interval = interval
        self.host_name = host_name
        self.clock = clock
        self.watcher = PolicyWatcher(Path(policy_dir), policy_loader)
        if collectors is not None:
            if host_collectors is not None or guest_collectors is not None:
                raise ValueError("give collectors by name or as objects, not both")
            host_collectors, guest_collectors = named_collectors(
                collectors, CollectorSources(hypervisor, proc_root, clock)
            )
        self.host_collectors = list(
            default_host_collectors(hypervisor, proc_root)
            if host_collectors is None
            else host_collectors
        )
        self.guest_collectors = list(
            default_guest_collectors(hypervisor, clock)
            if guest_collectors is None
            else guest_collectors
        )
        self.host_declaration = Declaration.of(self.host_collectors)
        self.guest_declaration = Declaration.of(self.guest_collectors)
        self.controllers = list(
            default_controllers(hypervisor, migration_sender)
            if controllers is None
            else controllers
        )
        self.reporter = reporter
        self.report_every = max(1, report_every)
        self.history = History(history_length)
        self.cycles = 0
        self._missing_logged: frozenset[str] = frozenset()
        self._left_out_before: set[str] = set()
        self._left_out_now: set[str] = set()

    def run_forever(
        self,
        stop_event: threading.Event,
        on_cycle: Callable[[CycleReport], None] | None = None,
    ) -> None:
        while not stop_event.is_set():
            started = self.clock()
            report = self.run_cycle()
            if on_cycle is not None:
                on_cycle(report)
            stop_event.wait(max(0.0, self.interval - (self.clock() - started)))

    def run_cycle(self) -> CycleReport:
        started = self.clock()
        self.cycles += 1
        report = CycleReport(cycle=self.cycles)
        report.policy_reloaded = self.watcher.refresh()
        # Wall-clock time of the listing: the API must judge the report as of now, not as of
        # its arrival, or claims made in between would look disproven.
        listed_at = datetime.now(UTC)
        context = dict(self.report_context()) if self.report_context is not None else {}
        try:
            guests = self.hypervisor.list_guests()
        except Exception as exc:  # any hypervisor failure: report it, try again next cycle
            log.error("cannot list guests: %s", exc)
            report.failures.append(Failure("agent", "host", f"list guests: {exc}"))
            report.duration_s = self.clock() - started
            return report
        report.guests = len(guests)
        by_name = {g.name: g for g in guests}
        collected = [self._guest_snapshot(g, report) for g in guests]
        snapshots = [s for s in collected if s.name not in report.left_out]
        host = self._host_snapshot(collected, report)
        self._forget_gone({g.uuid for g in guests})
        for name, reason in report.left_out.items():
            self._journal_left_out(report, name, by_name[name].uuid, reason)

        result = None
        if report.host_not_ready is not None:
            log.warning("host not ready, tick skipped: %s", report.host_not_ready)
            self._not_applied(report, NotApplied("host", "*", report.host_not_ready))
        else:
            result = self._evaluate(host, snapshots, report)
        if result is not None:
            for name, reason in result.left_out.items():
                report.left_out[name] = reason
                self._journal_left_out(report, name, by_name[name].uuid, reason)
            for name, refused in result.refused_controls.items():
                uuid = by_name[name].uuid if name in by_name else None
                for control, reason in refused.items():
                    self._not_applied(report, NotApplied(name, control, reason, uuid))
            report.host_controls = result.host_controls
            report.guest_controls = result.guest_controls
            report.missing_stats += [f"host.{s}" for s in result.missing_host_stats]
            for name, stats in result.missing_guest_stats.items():
                report.missing_stats += [f"{name}.{s}" for s in stats]
            ctx = ControlContext(
                result,
                host,
                by_name,
                {s.name: s for s in snapshots},
                on_applied=lambda action: self._journal(
                    report, lambda j: j.applied(report.cycle, action)
                ),
            )
            self._journal(report, lambda j: j.cycle_start(report.cycle, self.watcher.digest))
            self._control(ctx, report)
            self._journal(
                report,
                lambda j: j.cycle_end(report.cycle, len(report.actions), len(report.failures)),
            )

        self._left_out_before, self._left_out_now = self._left_out_now, set()
        report.missing_stats = sorted(set(report.missing_stats))
        self._log_missing(report.missing_stats)
        report.policy_file_errors = [str(e) for e in self.watcher.errors]
        report.rejected_policy = "; ".join(report.policy_file_errors) or None
        if self.reporter is not None and (self.cycles - 1) % self.report_every == 0:
            self._report(host, collected, guests, listed_at, context, report)
        report.duration_s = self.clock() - started
        return report

    def _evaluate(
        self, host: EntitySnapshot, guests: list[EntitySnapshot], report: CycleReport
    ) -> CycleResult | None:
        """One evaluation; a file version over a bound is rejected and the cycle evaluated
        once more without it (at most once: a cycle's time stays bounded)."""
        for attempt in (1, 2):
            try:
                result = self.watcher.policy.evaluate(host, guests)
            except PolicyLimitError as exc:
                if attempt == 1 and self.watcher.reject(exc):
                    report.policy_reloaded = True
                    continue
                error: PolicyError = exc
            except PolicyError as exc:
                error = exc
            else:
                self.watcher.cycle_succeeded()
                return result
            log.error("policy cycle failed, no control applied: %s", error)
            report.policy_error = str(error)
            self._not_applied(report, NotApplied("*", "*", f"policy error: {error}"))
            return None
        return None

    def _journal_left_out(self, report: CycleReport, name: str, uuid: str, reason: str) -> None:
        # Warn when a guest starts being left out; a guest that stays out every cycle (no
        # balloon device, say) would otherwise flood the log, as MOM's monitors avoid too.
        level = logging.DEBUG if name in self._left_out_before else logging.WARNING
        log.log(level, "guest %s left out of cycle %d: %s", name, report.cycle, reason)
        self._left_out_now.add(name)
        self._journal(report, lambda j: j.left_out(report.cycle, name, uuid, reason))

    def _not_applied(self, report: CycleReport, item: NotApplied) -> None:
        report.not_applied.append(item)
        self._journal(
            report,
            lambda j: j.not_applied(
                report.cycle, item.target, item.uuid, item.control, item.reason
            ),
        )

    def _guest_snapshot(self, guest: GuestInfo, report: CycleReport) -> EntitySnapshot:
        """The guest's sample this cycle; lacking a mandatory field, the guest goes into
        ``report.left_out`` and the sample is not kept in its history."""
        stats: Stats = {}
        properties: dict[str, Any] = {"uuid": guest.uuid}
        for collector in self.guest_collectors:
            try:
                values, props = collector.collect(guest)
            except Exception as exc:  # one broken source must not hide the others
                log.debug("collector %s failed for %s: %s", collector.name, guest.name, exc)
                report.failures.append(Failure(collector.name, guest.name, str(exc)))
                values, props = {}, {}
            for name in collector.fields:
                stats.setdefault(name, None)
            for name, value in values.items():
                if stats.get(name) is None:
                    stats[name] = value
            properties.update(props)
        # A field given as a property is no stat: an absent io_tune means "no IO policy",
        # not a failed read.
        for name in PROPERTY_FIELDS:
            stats.pop(name, None)
        report.missing_stats += [f"{guest.name}.{k}" for k, v in stats.items() if v is None]
        declared = self.guest_declaration.fields
        unready = self.guest_declaration.unready(stats, properties)
        if unready is not None:
            report.left_out[guest.name] = f"not ready: {unready}"
            history = self.history.samples(guest.uuid)
        else:
            history = self.history.add(guest.uuid, stats)
        return EntitySnapshot(guest.name, stats, history, properties, guest.tags, declared)

    def _host_snapshot(self, guests: list[EntitySnapshot], report: CycleReport) -> EntitySnapshot:
        stats: Stats = {}
        guest_stats = [g.stats for g in guests]
        for collector in self.host_collectors:
            try:
                values = collector.collect(guest_stats)
            except Exception as exc:  # one broken source must not hide the others
                log.debug("collector %s failed: %s", collector.name, exc)
                report.failures.append(Failure(collector.name, "host", str(exc)))
                values = {}
            for name in collector.fields:
                stats.setdefault(name, None)
            for name, value in values.items():
                if stats.get(name) is None:
                    stats[name] = value
        report.missing_stats += [f"host.{k}" for k, v in stats.items() if v is None]
        unready = self.host_declaration.unready(stats, {})
        if unready is not None:
            report.host_not_ready = f"host not ready: {unready}"
            history = self.history.samples("\0host")
        else:
            history = self.history.add("\0host", stats)
        return EntitySnapshot(
            self.host_name,
            stats,
            history,
            {"interval": self.interval},
            frozenset(),
            self.host_declaration.fields,
        )

    def _forget_gone(self, uuids: set[str]) -> None:
        self.history.keep_only(uuids | {"\0host"})
        for collector in self.guest_collectors:
            if isinstance(collector, _RemembersGuests):
                collector.forget(uuids)
        for controller in self.controllers:
            controller.forget(uuids)

    def _control(self, ctx: ControlContext, report: CycleReport) -> None:
        for controller in self.controllers:
            try:
                outcome = controller.apply(ctx)
            except Exception as exc:  # a broken controller must not stop the others
                log.exception("controller %s failed", controller.name)
                report.failures.append(
                    Failure(controller.name, "*", f"{type(exc).__name__}: {exc}")
                )
                continue
            for failure in outcome.failures:
                # Told to the operator by the agent's narration, once while it repeats.
                log.debug("%s on %s: %s", failure.controller, failure.target, failure.error)
            report.actions += outcome.actions
            report.failures += outcome.failures

    def _journal(self, report: CycleReport, write: Callable[[AppliedJournal], None]) -> None:
        if self.journal is None:
            return
        try:
            write(self.journal)
        except JournalError as exc:
            # A journal that cannot be written lags the hypervisor, as after a crash; the
            # host still needs its controls, so the cycle goes on.
            log.error("%s", exc)
            report.failures.append(Failure("journal", self.host_name, str(exc)))

    def _log_missing(self, missing: list[str]) -> None:
        # Warn when the set changes; a stat missing for hours would otherwise flood the log.
        current = frozenset(missing)
        if current - self._missing_logged:
            log.warning(
                "stats not collected: %s", ", ".join(sorted(current - self._missing_logged))
            )
        self._missing_logged = current

    def _report(
        self,
        host: EntitySnapshot,
        snapshots: list[EntitySnapshot],
        guests: list[GuestInfo],
        listed_at: datetime,
        context: Mapping[str, Any],
        report: CycleReport,
    ) -> None:
        assert self.reporter is not None
        payload = {**usage_payload(host, snapshots, guests, listed_at), **context}
        try:
            self.reporter(self.host_name, payload)
        except Exception as exc:  # the API being down must not stop the host's control
            log.warning("report to the loadmaster API failed: %s", exc)
            report.failures.append(
                Failure("reporter", self.host_name, f"{type(exc).__name__}: {exc}")
            )
            return
        report.reported = True


def usage_payload(
    host: EntitySnapshot,
    snapshots: Sequence[EntitySnapshot],
    guests: Sequence[GuestInfo],
    listed_at: datetime,
) -> dict[str, Any]:
    """The body of ``POST /hosts/{name}/report``; figures the collectors lacked are left out.
    ``as_of`` is when the guests were listed."""
    total, free = host.stats.get("mem_available"), host.stats.get("mem_free")
    vcpus = [s.stats.get("vcpu_count") for s in snapshots]
    usage: dict[str, float] = {"VCPU": sum(v for v in vcpus if v is not None)}
    load: dict[str, float] = {}
    if total and free is not None:
        used = max(0.0, float(total - free))
        usage["MEMORY_MB"] = round(used / 1024, 1)
        load["memory"] = round(min(1.0, used / total), 4)
    cpu_load = host.stats.get("cpu_load")
    if cpu_load is not None:
        load["cpu"] = round(float(cpu_load), 4)
    return {
        "running_vms": [g.uuid for g in guests],
        "usage": usage,
        "load": load,
        "as_of": listed_at.isoformat(),
    }
