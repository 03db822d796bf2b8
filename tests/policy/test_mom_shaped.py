"""A MOM deployment's policy directory on hand-built snapshots.

The files in ``fixtures/mom-shaped`` were written for these tests (they are not vdsm's
``mom.d``); they use the language the way such deployments do: switches in 00 overridden
by 01, StatAvg over histories, a function that reads ``guest`` through dynamic scope, nil
comparisons, and host and guest controls for balloon, KSM, CPU and IO tune.

Every expected control below is MOM's: obtained by running MOM 0.6.5's own ``Policy`` and
``Entity`` (oVirt/mom ``3de1c8e``, ``mom/Policy``, ``mom/Entity.py`` and the ``IoTune``
objects of ``mom/Collectors/GuestIoTune.py``) on the same files and the same samples,
outside this repository, and checked against the arithmetic written in the comments.

KiB throughout. The pressured host has 20,000,000 KiB; its mem_free history averages
4,500,000, so free_share = 0.225: below "tight" (0.25), above "severe" (0.08). Its last
sample alone (6,000,000, 0.3) would not be under pressure, so StatAvg matters.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from policy_helpers import MOM_SHAPED, guest, host

from loadmaster.policy import PolicyError, load_policy_dir, load_policy_files

SWITCHES = MOM_SHAPED / "00-switches.policy"
IO_MAX = {
    "total_bytes_sec": 8_000_000,
    "read_bytes_sec": 6_000_000,
    "write_bytes_sec": 2_000_000,
    "total_iops_sec": 400,
    "read_iops_sec": 300,
    "write_iops_sec": 100,
}


def pressured_host(**overrides: float) -> object:
    stats: dict[str, float | None] = {
        "mem_available": 20_000_000,
        "mem_free": 6_000_000,
        "ksm_shareable": 6_000_000,
        "ksm_pages_shared": 0,
        "ksm_merge_across_nodes": 1,
        "ksm_pages_to_scan": 300,
        "cpu_count": 8,
    }
    stats.update(overrides)
    return host(history=[{"mem_free": 3_000_000}, {"mem_free": 6_000_000}], **stats)


def cpu(limit: float, quota: int = -1, period: int = 50_000) -> dict[str, float]:
    return {"vcpu_user_limit": limit, "vcpu_count": 4, "vcpu_quota": quota, "vcpu_period": period}


def three_guests() -> list[object]:
    web = guest(
        "web",
        history=[
            {"balloon_cur": 6_000_000, "mem_unused": 600_000},
            {"balloon_cur": 6_000_000, "mem_unused": 1_400_000},
        ],
        properties={
            "io_tune": [{"name": "vda", "path": "/dev/vda", "maximum": IO_MAX, "current": {}}]
        },
        balloon_cur=6_000_000,
        balloon_max=6_000_000,
        balloon_min=2_000_000,
        mem_unused=1_400_000,
        **cpu(25),
    )
    db = guest(
        "db",
        balloon_cur=3_000_000,
        balloon_max=6_000_000,
        balloon_min=1_000_000,
        mem_unused=200_000,
        **cpu(100, quota=40_000, period=100_000),
    )
    new = guest(
        "new",
        balloon_cur=800_000,
        balloon_max=4_000_000,
        balloon_min=1_500_000,
        mem_unused=None,
        **cpu(100),
    )
    return [web, db, new]


def test_whole_directory_under_pressure() -> None:
    result = load_policy_dir(MOM_SHAPED).evaluate(pressured_host(), three_guests())  # type: ignore[arg-type]

    # KSM: low_mark = 0.25 * 20e6 = 5e6. Nothing merged, so the NUMA mode 01-site wants
    # (0) is set. Average free 4.5e6 < 5e6: KSM runs, sleeps max(5, 20 * 8388608 / 20e6)
    # = 8.388608 ms and scans 300 + 200 = 500 pages.
    assert result.host_controls == {
        "ksm_merge_across_nodes": 0,
        "ksm_run": 1,
        "ksm_sleep_millisecs": 8.388608,
        "ksm_pages_to_scan": 500,
    }

    web = result.guest_controls["web"]
    # Reclaim: spare = 0.15 * (0.225 / 0.25) = 0.135; in use = avg(6e6, 6e6) -
    # avg(0.6e6, 1.4e6) = 5e6; wanted = 5e6 + 0.135 * 6e6 = 5.81e6, above the 4 % step
    # 5.76e6 and below balloon_cur. (The last sample alone would give the step, 5.76e6.)
    assert web["balloon_target"] == pytest.approx(5_810_000)
    # CPU: 25 % of 8 CPUs * 50000 us = 100000 us over 4 vCPUs = 25000; the period already
    # is 50000, so only the quota is sent.
    assert web["vcpu_quota"] == 25_000.0
    assert "vcpu_period" not in web
    assert web["io_tune"] == [{"name": "vda", "path": "/dev/vda", "ioTune": IO_MAX}]

    # db: wanted = 2.8e6 + 0.135 * 3e6 = 3.205e6, above balloon_cur 3e6: no balloon
    # control. No CPU limit, and its quota and period differ from -1 and 50000: both sent.
    assert result.guest_controls["db"] == {"vcpu_quota": -1, "vcpu_period": 50_000}

    # new has no mem_unused: skipped by the balloon rule, but below its 1.5e6 minimum, so
    # keep_floor (which reads "guest" through dynamic scope) restores it. Its CPU values
    # already are the unlimited ones: no CPU control.
    assert result.guest_controls["new"] == {"balloon_target": 1_500_000}
    assert result.missing_guest_stats == {"new": ("mem_unused",)}
    assert result.missing_host_stats == ()


def test_reclaim_switched_off_only_grows_guests() -> None:
    # Without 01-site reclaim_switch stays "no" (00-switches): the host is under pressure
    # (free_share 4e6 / 20e6 = 0.2 < 0.25) but the guest grows. spare = 0.15 * 0.8 = 0.12;
    # wanted = 2.8e6 + 0.12 * 3e6 = 3.16e6, above the 4 % step 3.12e6, below max 5e6.
    files = [SWITCHES, MOM_SHAPED / "02-memory.policy"]
    g = guest(
        "g",
        balloon_cur=3_000_000,
        balloon_max=5_000_000,
        balloon_min=1_000_000,
        mem_unused=200_000,
    )
    result = load_policy_files(files).evaluate(
        host(mem_available=20_000_000, mem_free=4_000_000), [g]
    )
    assert result.guest_controls == {"g": {"balloon_target": pytest.approx(3_160_000)}}


def test_severe_pressure_and_ksm_unmerge(tmp_path: Path) -> None:
    override = tmp_path / "09-override.policy"
    override.write_text("(set reclaim_switch yes)\n(set merge_switch no)\n")
    files = [*sorted(MOM_SHAPED.glob("*.policy")), override]
    h = host(
        mem_available=20_000_000,
        mem_free=1_000_000,
        ksm_shareable=0,
        ksm_pages_shared=25,
        ksm_merge_across_nodes=1,
        ksm_pages_to_scan=300,
        cpu_count=8,
    )
    g = guest(
        "g",
        balloon_cur=5_000_000,
        balloon_max=5_000_000,
        balloon_min=1_000_000,
        mem_unused=100_000,
        **cpu(100),
    )
    result = load_policy_files(files).evaluate(h, [g])
    # KSM switched off with 25 pages merged: unmerge (2); pages are still merged, so the
    # NUMA mode is left alone.
    assert result.host_controls == {"ksm_run": 2}
    # free_share = 0.05 <= 0.08: no headroom, wanted = in use = 4.9e6, above the 4 % step
    # 4.8e6. (With headroom it would be 5.05e6 and nothing would move.)
    assert result.guest_controls == {"g": {"balloon_target": pytest.approx(4_900_000)}}


def test_cpu_quota_and_period_stretch_for_tiny_quotas() -> None:
    files = [SWITCHES, MOM_SHAPED / "04-cpu.policy"]
    g = guest("g", vcpu_user_limit=1, vcpu_count=8, vcpu_quota=-1, vcpu_period=50_000)
    result = load_policy_files(files).evaluate(host(cpu_count=2), [g])
    # quota = 0.01 * 50000 * 2 / 8 = 125 < 2000: both stretched by 2000 / 125 = 16.
    assert result.guest_controls == {"g": {"vcpu_quota": 2000, "vcpu_period": 800_000.0}}


def test_io_tune_switched_off_lifts_limits(tmp_path: Path) -> None:
    params = tmp_path / "01-parameters.policy"
    params.write_text("(set disk_cap_switch no)\n")
    entry = {"name": "vda", "path": "/dev/vda", "maximum": IO_MAX, "current": IO_MAX}
    g = guest("g", properties={"io_tune": [entry]})
    files = [SWITCHES, params, MOM_SHAPED / "05-disks.policy"]
    result = load_policy_files(files).evaluate(host(), [g])
    zero = dict.fromkeys(IO_MAX, 0)
    assert result.guest_controls == {
        "g": {"io_tune": [{"name": "vda", "path": "/dev/vda", "ioTune": zero}]}
    }


def test_files_run_in_name_order_whatever_order_they_are_given() -> None:
    files = sorted(MOM_SHAPED.glob("*.policy"))
    forward = load_policy_files(files).evaluate(pressured_host(), three_guests())  # type: ignore[arg-type]
    backward = load_policy_files(reversed(files)).evaluate(pressured_host(), three_guests())  # type: ignore[arg-type]
    assert forward == backward
    # In the wrong order 01-site would run before its switches exist.
    assert forward.host_controls["ksm_merge_across_nodes"] == 0


def test_set_of_an_undeclared_switch_aborts_the_whole_cycle(tmp_path: Path) -> None:
    extra = tmp_path / "99-extra.policy"
    extra.write_text("# site tweak\n(set merge_swich no)\n")
    policy = load_policy_files([*MOM_SHAPED.glob("*.policy"), extra])
    with pytest.raises(PolicyError) as info:
        policy.evaluate(pressured_host(), three_guests())  # type: ignore[arg-type]
    assert (
        str(info.value)
        == "99-extra.policy:2:6: undefined symbol merge_swich (set needs a defvar first)"
    )


def test_nil_stat_leaves_only_that_guest_out() -> None:
    # 04-cpu compares vcpu_user_limit without checking it: in MOM a guest without it fails
    # the whole cycle (MOM: no control at all). Here that guest is left out and the other
    # gets what MOM gives it alone on the host: 50 % of 2 CPUs * 50000 / 2 vCPUs = 25000
    # (docs/mom-differences.md).
    bad = guest("bad", vcpu_count=2, vcpu_quota=-1, vcpu_period=50_000)
    good = guest("good", vcpu_user_limit=50, vcpu_count=2, vcpu_quota=-1, vcpu_period=50_000)
    files = [SWITCHES, MOM_SHAPED / "04-cpu.policy"]
    result = load_policy_files(files).evaluate(host(cpu_count=2), [bad, good])
    assert result.guest_controls == {"good": {"vcpu_quota": 25000.0}}
    reason = result.left_out["bad"]
    assert reason.startswith("policy failed on its nil vcpu_user_limit: 04-cpu.policy:")
    assert "cannot apply < to nil" in reason


def test_error_on_a_complete_guest_still_fails_the_cycle() -> None:
    # Nothing was missing, so the policy itself is at fault: as in MOM, no control at all.
    g = guest("g", vcpu_user_limit="fifty", vcpu_count=2, vcpu_quota=-1, vcpu_period=50_000)  # type: ignore[arg-type]
    files = [SWITCHES, MOM_SHAPED / "04-cpu.policy"]
    with pytest.raises(PolicyError) as info:
        load_policy_files(files).evaluate(host(cpu_count=2), [g])
    assert info.value.file == "04-cpu.policy"
