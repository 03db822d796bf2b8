"""KSM: the host's kernel same-page merging knobs."""

from __future__ import annotations

from typing import Any

from loadmaster.agent.hypervisor.base import HypervisorError
from loadmaster.agent.sla.controllers.base import (
    Action,
    ControlContext,
    Failure,
    HypervisorController,
    Outcome,
)


class KsmController(HypervisorController):
    """Host ``ksm_*`` controls, written to the KSM knobs of the same name.

    The kernel refuses a new ``merge_across_nodes`` while pages are shared, so that change
    is made as: unmerge (``run=2``), write ``merge_across_nodes``, then restore ``run``.
    """

    name = "ksm"
    HOST = "host"

    def forget(self, targets: set[str]) -> None:
        return

    def apply(self, ctx: ControlContext) -> Outcome:
        out = ctx.outcome()
        wanted = {
            key[4:]: int(value)
            for key, value in ctx.result.host_controls.items()
            if key.startswith("ksm_") and value is not None
        }

        def current(knob: str) -> Any:
            return self._last(self.HOST, knob, ctx.host.stats.get(f"ksm_{knob}"))

        changed = {k: v for k, v in wanted.items() if v != current(k)}
        writes: list[tuple[str, int]] = []
        if "merge_across_nodes" in changed:
            previous_run = current("run")
            run_after = changed.pop("run", wanted.get("run", previous_run))
            writes += [("run", 2), ("merge_across_nodes", changed.pop("merge_across_nodes"))]
            if run_after is not None and run_after != 2:
                writes.append(("run", int(run_after)))
        # Tune the scan before starting it, so KSM never runs a cycle with stale settings.
        run = changed.pop("run", None)
        writes += sorted(changed.items())
        if run is not None:
            writes.append(("run", run))
        for knob, value in writes:
            try:
                self.hypervisor.ksm_write(knob, value)
            except HypervisorError as exc:
                # Later writes depend on earlier ones (never merge-change without the unmerge).
                out.failures.append(Failure(self.name, self.HOST, str(exc)))
                break
            self._applied[(self.HOST, knob)] = value
            out.applied(Action(self.name, self.HOST, f"ksm_{knob}", value))
        return out
