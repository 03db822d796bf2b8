"""Interface bandwidth limits by tc, for hosts whose kernel cannot take libvirt's own.

libvirt limits a guest's NIC with htb, sfq and an fw filter (inbound: what the guest
receives, the tap's egress) and an ingress qdisc with a u32 police filter (outbound).
A kernel without ``sch_sfq``, ``cls_fw`` or ``act_police`` fails those calls half way,
leaving an ``htb 1: root`` or an ``ingress`` on the tap, and a ``<bandwidth>`` in the
domain XML keeps the guest from starting. ``TapShaper`` does without them:

- inbound: ``htb`` at the tap's root, one class ``1:1`` (rate = average, ceil = peak,
  burst), which all traffic takes;
- outbound: an ``ingress`` qdisc on the tap whose one u32 filter redirects everything to
  an ifb device (``lmifb<tap ifindex>``, its alias the tap's name), shaped like the
  inbound side at its root.

Limits are read back from the tc state, so what is reported is what is in force. A change
that fails part way removes that direction's shaping: a tap is shaped entirely or not at
all (a root htb or ingress libvirt left behind is replaced). An ifb whose tap is gone (its guest stopped, moved or removed) is deleted by
``sweep``. ``libvirt_can_shape`` tells the two kinds of host apart once, on a scratch
device.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import secrets
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from loadmaster.agent.hypervisor.base import NET_DIRECTIONS, NET_KEYS, NET_PARAMS, HypervisorError

log = logging.getLogger(__name__)

Runner = Callable[[Sequence[str]], str]
"""Runs one ``tc`` or ``ip`` command, returning its output; raises ``ShapingError``."""

IFB_PREFIX = "lmifb"
PROBE_PREFIX = "lmprobe"
COMMAND_TIMEOUT_S = 10.0
# The sbin directories, where tc and ip are, are not on every service's PATH.
SBIN_PATH = "/usr/sbin:/sbin:/usr/bin:/bin"
# What libvirt's limits need beyond what TapShaper uses: sfq and fw (inbound), police
# (outbound), tried on a scratch device exactly as libvirt uses them.
LIBVIRT_PROBE = (
    "qdisc add dev {dev} root handle 1: htb default 1",
    "class add dev {dev} parent 1: classid 1:1 htb rate 8kbps",
    "qdisc add dev {dev} parent 1:1 handle 2: sfq perturb 10",
    "filter add dev {dev} parent 1:0 protocol all handle 1 fw flowid 1",
    "qdisc add dev {dev} ingress",
    "filter add dev {dev} parent ffff: protocol all u32 match u32 0 0"
    " police rate 8kbps burst 1kb mtu 64kb drop flowid :1",
)
_RATE = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)(i?)bit$")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([KMG]?)b$")
_UNITS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}


class ShapingError(HypervisorError):
    pass


def run_command(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            env={**os.environ, "PATH": f"{os.environ.get('PATH', '')}:{SBIN_PATH}"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ShapingError(f"{' '.join(argv)}: {exc}") from exc
    if done.returncode != 0:
        raise ShapingError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def parse_rate(text: str) -> int:
    """tc's printed rate (``2048Kibit``, ``2097Kbit``, ``100Mibit``) in bytes per second."""
    found = _RATE.match(text)
    if found is None:
        raise ShapingError(f"unexpected rate {text!r} from tc")
    number, unit, iec = found.groups()
    return round(float(number) * (1024 if iec else 1000) ** _UNITS[unit] / 8)


def parse_size(text: str) -> int | None:
    """tc's printed size in bytes; None when it is not a whole number of KiB (tc prints
    ``1599b`` for htb's own burst, ``10Kb`` for one of 10 KiB given)."""
    found = _SIZE.match(text)
    if found is None:
        raise ShapingError(f"unexpected size {text!r} from tc")
    number, unit = found.groups()
    if not unit:
        return None
    return round(float(number) * 1024 ** _UNITS[unit])


def htb_class(runner: Runner, dev: str) -> dict[str, int] | None:
    """Average, peak (0 when the ceiling is the rate) and burst (0 for htb's own) of the
    class 1:1 under the root htb of ``dev``, in KiB/s and KiB; None without one."""
    out = runner(("tc", "-iec", "class", "show", "dev", dev))
    for line in out.splitlines():
        words = line.split()
        if words[:3] != ["class", "htb", "1:1"]:
            continue
        fields = dict(itertools.pairwise(words))
        rate = parse_rate(fields["rate"])
        ceil = parse_rate(fields.get("ceil", fields["rate"]))
        burst = parse_size(fields.get("burst", "0b"))
        return {
            "average": round(rate / 1024),
            "peak": round(ceil / 1024) if ceil != rate else 0,
            "burst": round(burst / 1024) if burst else 0,
        }
    return None


def htb_args(limits: Mapping[str, int]) -> list[str]:
    """The class 1:1 parameters for ``average``, ``peak`` (KiB/s) and ``burst`` (KiB), as
    libvirt sets them: the ceiling is the peak (at least the rate)."""
    average = limits["average"]
    args = ["rate", f"{average * 8}Kibit", "ceil", f"{max(average, limits['peak']) * 8}Kibit"]
    if limits["burst"]:
        args += ["burst", f"{limits['burst']}kb"]
    return args


class TapShaper:
    """Limits on the host's taps with htb (and an ifb for outbound); see the module."""

    def __init__(self, runner: Runner = run_command, sys_net: Path = Path("/sys/class/net")):
        self.runner = runner
        self.sys_net = sys_net

    def _tc(self, *args: str) -> str:
        return self.runner(("tc", *args))

    def _ifb(self, tap: str) -> str:
        try:
            index = (self.sys_net / tap / "ifindex").read_text().strip()
        except OSError as exc:
            raise ShapingError(f"no interface {tap} on this host") from exc
        return f"{IFB_PREFIX}{index}"

    def bandwidth(self, tap: str) -> dict[str, int]:
        """The ``NET_KEYS`` limits in force on ``tap`` (0 = none)."""
        found = dict.fromkeys(NET_KEYS, 0)
        # One command for a tap without shaping: the collector asks every cycle.
        qdiscs = self._qdiscs(tap)
        if any(q.get("root") and q.get("kind") == "htb" for q in qdiscs):
            for key, value in (htb_class(self.runner, tap) or {}).items():
                found[f"inbound.{key}"] = value
        redirect = None
        if any(q.get("kind") == "ingress" for q in qdiscs):
            redirect = self._redirect(tap)
        if redirect is not None:
            for key, value in (htb_class(self.runner, redirect) or {}).items():
                found[f"outbound.{key}"] = value
        return found

    def set_bandwidth(self, tap: str, limits: Mapping[str, int]) -> None:
        """Set each direction that ``limits`` names (``NET_KEYS``; a direction's missing
        peak or burst is 0); an average of 0 removes that direction's shaping."""
        for direction in NET_DIRECTIONS:
            if not any(k.startswith(f"{direction}.") for k in limits):
                continue
            wanted = {p: int(limits.get(f"{direction}.{p}", 0)) for p in NET_PARAMS}
            if direction == "inbound":
                self._set_inbound(tap, wanted)
            else:
                self._set_outbound(tap, wanted)

    def sweep(self) -> None:
        """Delete the ifb devices whose tap is gone (or is another device by now)."""
        for dev in sorted(self.sys_net.glob(f"{IFB_PREFIX}*")):
            try:
                tap = (dev / "ifalias").read_text().strip()
                index = dev.name.removeprefix(IFB_PREFIX)
                if (self.sys_net / tap / "ifindex").read_text().strip() == index:
                    continue
            except OSError:
                pass  # no alias, or no such tap: either way nothing uses it
            self._delete_link(dev.name)

    # -- inbound: htb at the tap's root ----------------------------------------------

    def _qdiscs(self, dev: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = json.loads(
            self._tc("-j", "qdisc", "show", "dev", dev) or "[]"
        )
        return found

    def _root_htb(self, dev: str) -> bool:
        return any(q.get("root") and q.get("kind") == "htb" for q in self._qdiscs(dev))

    def _shape(self, dev: str, limits: Mapping[str, int]) -> None:
        if self._root_htb(dev) and htb_class(self.runner, dev) is not None:
            self._tc(
                "class",
                "change",
                "dev",
                dev,
                "parent",
                "1:",
                "classid",
                "1:1",
                "htb",
                *htb_args(limits),
            )
            return
        self._tc("qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "1")
        self._tc(
            "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", *htb_args(limits)
        )

    def _set_inbound(self, tap: str, limits: Mapping[str, int]) -> None:
        if not limits["average"]:
            self._remove_inbound(tap)
            return
        with self._undone_on_failure(lambda: self._remove_inbound(tap)):
            self._shape(tap, limits)

    def _remove_inbound(self, tap: str) -> None:
        if self._root_htb(tap):
            self._tc("qdisc", "del", "dev", tap, "root")

    # -- outbound: the tap's ingress redirected to an ifb, htb at its root ------------

    def _redirect(self, tap: str) -> str | None:
        filters = json.loads(self._tc("-j", "filter", "show", "dev", tap, "ingress") or "[]")
        for entry in filters:
            for action in entry.get("options", {}).get("actions", []):
                if action.get("kind") == "mirred" and action.get("to_dev"):
                    return str(action["to_dev"])
        return None

    def _set_outbound(self, tap: str, limits: Mapping[str, int]) -> None:
        if not limits["average"]:
            self._remove_outbound(tap)
            return
        ifb = self._ifb(tap)
        with self._undone_on_failure(lambda: self._remove_outbound(tap)):
            if not (self.sys_net / ifb).exists():
                self.runner(("ip", "link", "add", ifb, "type", "ifb"))
                self.runner(("ip", "link", "set", "dev", ifb, "alias", tap))
                self.runner(("ip", "link", "set", "dev", ifb, "up"))
            self._shape(ifb, limits)
            if self._redirect(tap) != ifb:
                self._remove_ingress(tap)
                self._tc("qdisc", "add", "dev", tap, "handle", "ffff:", "ingress")
                self._tc(
                    *("filter", "add", "dev", tap, "parent", "ffff:", "protocol", "all"),
                    *("u32", "match", "u32", "0", "0", "action", "mirred", "egress"),
                    *("redirect", "dev", ifb),
                )

    def _remove_ingress(self, tap: str) -> None:
        if any(q.get("kind") == "ingress" for q in self._qdiscs(tap)):
            self._tc("qdisc", "del", "dev", tap, "ingress")

    def _remove_outbound(self, tap: str) -> None:
        self._remove_ingress(tap)
        ifb = self._ifb(tap)
        if (self.sys_net / ifb).exists():
            self._delete_link(ifb)

    def _delete_link(self, dev: str) -> None:
        self.runner(("ip", "link", "del", dev))

    @contextmanager
    def _undone_on_failure(self, undo: Callable[[], None]) -> Iterator[None]:
        try:
            yield
        except ShapingError:
            try:
                undo()
            except ShapingError as exc:
                # The error that led here is the one worth reporting.
                log.warning("removing part-made shaping failed too: %s", exc)
            raise


def libvirt_can_shape(runner: Runner = run_command) -> bool:
    """Whether this host's kernel takes libvirt's interface limits: tried once on a scratch
    ifb device, deleted afterwards. A host where not even that device can be made (no
    ifb, no permission) is left to libvirt, whose errors then say why."""
    # Random: hypervisor connections of one process may probe at once.
    dev = f"{PROBE_PREFIX}{secrets.token_hex(4)}"
    try:
        runner(("ip", "link", "add", dev, "type", "ifb"))
    except ShapingError as exc:
        log.warning("cannot probe interface limits (%s): libvirt's are used", exc)
        return True
    try:
        for command in LIBVIRT_PROBE:
            runner(("tc", *command.format(dev=dev).split()))
    except ShapingError as exc:
        log.info("libvirt cannot limit interfaces on this kernel (%s): tc shaping is used", exc)
        return False
    finally:
        try:
            runner(("ip", "link", "del", dev))
        except ShapingError as exc:
            log.warning("scratch device %s stays: %s", dev, exc)
    return True
