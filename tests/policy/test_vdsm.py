"""vdsm's mom.d policies, unchanged, on hand-built snapshots; expected numbers worked out by hand.

KiB throughout. The host has 16,000,000 KiB; its mem_free history averages 2,000,000, so
host_free_percent = 0.125: under pressure (< 0.20), not critical (> 0.05).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from policy_helpers import VDSM, guest, host

from loadmaster.policy import PolicyError, load_policy_dir, load_policy_files

IO_MAX = {
    "total_bytes_sec": 1000,
    "read_bytes_sec": 500,
    "write_bytes_sec": 500,
    "total_iops_sec": 100,
    "read_iops_sec": 50,
    "write_iops_sec": 50,
}


def pressured_host(**overrides: float) -> object:
    stats: dict[str, float | None] = {
        "mem_available": 16_000_000,
        "mem_free": 2_400_000,
        "ksm_shareable": 4_000_000,
        "ksm_pages_shared": 0,
        "ksm_merge_across_nodes": 1,
        "ksm_pages_to_scan": 100,
        "cpu_count": 4,
    }
    stats.update(overrides)
    return host(history=[{"mem_free": 1_600_000}, {"mem_free": 2_400_000}], **stats)


def cpu(limit: float) -> dict[str, float]:
    return {"vcpu_user_limit": limit, "vcpu_count": 2, "vcpu_quota": -1, "vcpu_period": 100_000}


def three_guests() -> list[object]:
    g1 = guest(
        "g1",
        history=[
            {"balloon_cur": 4_000_000, "mem_unused": 1_500_000},
            {"balloon_cur": 4_000_000, "mem_unused": 2_500_000},
        ],
        properties={
            "io_tune": [{"name": "vda", "path": "/dev/vda", "maximum": IO_MAX, "current": {}}]
        },
        balloon_cur=4_000_000,
        balloon_max=4_000_000,
        balloon_min=1_000_000,
        mem_unused=2_500_000,
        **cpu(50),
    )
    g2 = guest(
        "g2",
        balloon_cur=2_000_000,
        balloon_max=4_000_000,
        balloon_min=1_000_000,
        mem_unused=100_000,
        **cpu(100),
    )
    g3 = guest(
        "g3",
        balloon_cur=500_000,
        balloon_max=4_000_000,
        balloon_min=1_000_000,
        mem_unused=None,
        **cpu(100),
    )
    return [g1, g2, g3]


def test_vdsm_policies_under_pressure() -> None:
    result = load_policy_dir(VDSM).evaluate(pressured_host(), three_guests())  # type: ignore[arg-type]

    # KSM: threshold = 0.2 * 16e6 = 3.2e6. No shared pages, so the merge policy is
    # (re)applied. shareable 4e6: 3.2e6 + 4e6 < 16e6 holds but avg free 2e6 > 3.2e6 does
    # not, so KSM runs; sleep = max(10, 10 * 16777216 / 16e6) = 10.48576; free memory is
    # below the threshold, so pages_to_scan = 100 + 300 = 400.
    assert result.host_controls == {
        "ksm_merge_across_nodes": 1,
        "ksm_run": 1,
        "ksm_sleep_millisecs": 10.48576,
        "ksm_pages_to_scan": 400,
    }

    g1 = result.guest_controls["g1"]
    # Shrink: guest_free = 0.2 * 0.125 / 0.2 = 0.125; used = avg(4e6) - avg(1.5e6, 2.5e6)
    # = 2e6; floor = max(1e6, 2e6 + 0.125 * 4e6) = 2.5e6; 5 % step = 3.8e6 >= floor;
    # |3.8e6 - 4e6| = 2e5 > 0.0025 * 4e6 = 1e4, so the balloon moves to 3.8e6.
    assert g1["balloon_target"] == pytest.approx(3_800_000)
    # CPU: 50 % of 4 CPUs * 100000 us = 200000 us over 2 vCPUs = 100000 per vCPU (> 1000,
    # multiplier 1); the period already is 100000, so only the quota is sent.
    assert g1["vcpu_quota"] == 100_000.0
    assert "vcpu_period" not in g1
    assert g1["io_tune"] == [{"name": "vda", "path": "/dev/vda", "ioTune": IO_MAX}]

    # g2: used = 2e6 - 1e5 = 1.9e6; floor = max(1e6, 1.9e6 + 0.125 * 2e6) = 2.15e6, above
    # balloon_cur 2e6, so shrinking would grow it: no balloon control. No CPU limit: reset.
    assert result.guest_controls["g2"] == {"vcpu_quota": -1, "vcpu_period": 100_000}

    # g3 has no mem_unused: skipped by the balloon rule, but below its 1e6 minimum, so
    # the minimum-guarantee rule restores it.
    assert result.guest_controls["g3"] == {
        "balloon_target": 1_000_000,
        "vcpu_quota": -1,
        "vcpu_period": 100_000,
    }
    assert result.missing_guest_stats == {"g3": ("mem_unused",)}
    assert result.missing_host_stats == ()


def test_vdsm_balloon_disabled_grows_guests() -> None:
    # Without 01-parameters balloonEnabled stays 0 (00-defines), so guests only grow.
    files = [VDSM / "00-defines.policy", VDSM / "02-balloon.policy"]
    g = guest(
        "g",
        balloon_cur=3_000_000,
        balloon_max=4_000_000,
        balloon_min=1_000_000,
        mem_unused=1_000_000,
    )
    result = load_policy_files(files).evaluate(
        host(mem_available=16_000_000, mem_free=8_000_000), [g]
    )
    # host_free = 0.5; guest_free = 0.2 * 0.5 / 0.2 = 0.5; used = 2e6;
    # floor = max(1e6, 2e6 + 0.5 * 3e6) = 3.5e6 > 3e6 * 1.05 = 3.15e6, and <= max 4e6.
    assert result.guest_controls == {"g": {"balloon_target": 3_500_000}}


def test_vdsm_critical_pressure_and_ksm_unmerge(tmp_path: Path) -> None:
    params = tmp_path / "01-parameters.policy"
    params.write_text("(set balloonEnabled True)\n(set ksmEnabled False)\n")
    files = [*sorted(VDSM.glob("*.policy")), params]
    h = host(
        mem_available=16_000_000,
        mem_free=500_000,
        ksm_shareable=0,
        ksm_pages_shared=10,
        ksm_merge_across_nodes=1,
        ksm_pages_to_scan=100,
        cpu_count=4,
    )
    g = guest(
        "g",
        balloon_cur=4_000_000,
        balloon_max=4_000_000,
        balloon_min=1_000_000,
        mem_unused=3_500_000,
        **cpu(100),
    )
    result = load_policy_files(files).evaluate(h, [g])
    # KSM disabled with 10 shared pages: apply_NUMA_policy answers 2 (unmerge); pages are
    # still shared, so the merge policy is left alone.
    assert result.host_controls == {"ksm_run": 2}
    # host_free = 0.03125 <= 0.05: guest_free = -0.05 + 0.03125 = -0.01875; used = 5e5;
    # floor = max(1e6, 5e5 - 75000) = 1e6; the 5 % step 3.8e6 wins.
    assert result.guest_controls["g"]["balloon_target"] == pytest.approx(3_800_000)


def test_cpu_quota_multiplier_for_tiny_quotas() -> None:
    files = [VDSM / "00-defines.policy", VDSM / "04-cputune.policy"]
    g = guest("g", vcpu_user_limit=1, vcpu_count=8, vcpu_quota=-1, vcpu_period=100_000)
    result = load_policy_files(files).evaluate(host(cpu_count=2), [g])
    # maxCpuTime = 0.01 * 100000 * 2 = 2000; per vCPU 250 <= 1000, so the multiplier is
    # 1 + 1000 / 250 = 5: quota 1250, period 500000.
    assert result.guest_controls == {"g": {"vcpu_quota": 1250.0, "vcpu_period": 500_000}}


def test_io_tune_disabled_resets_limits(tmp_path: Path) -> None:
    params = tmp_path / "01-parameters.policy"
    params.write_text("(set ioTuneEnabled False)\n")
    entry = {"name": "vda", "path": "/dev/vda", "maximum": IO_MAX, "current": IO_MAX}
    g = guest("g", properties={"io_tune": [entry]})
    files = [VDSM / "00-defines.policy", params, VDSM / "05-iotune.policy"]
    result = load_policy_files(files).evaluate(host(), [g])
    zero = dict.fromkeys(IO_MAX, 0)
    assert result.guest_controls == {
        "g": {"io_tune": [{"name": "vda", "path": "/dev/vda", "ioTune": zero}]}
    }


def test_files_run_in_name_order_whatever_order_they_are_given() -> None:
    files = sorted(VDSM.glob("*.policy"))
    forward = load_policy_files(files).evaluate(pressured_host(), three_guests())  # type: ignore[arg-type]
    backward = load_policy_files(reversed(files)).evaluate(pressured_host(), three_guests())  # type: ignore[arg-type]
    assert forward == backward


def test_set_of_an_undeclared_knob_aborts_the_whole_cycle(tmp_path: Path) -> None:
    extra = tmp_path / "99-extra.policy"
    extra.write_text("# site tweak\n(set ksmEnable 0)\n")
    policy = load_policy_files([*VDSM.glob("*.policy"), extra])
    with pytest.raises(PolicyError) as info:
        policy.evaluate(pressured_host(), three_guests())  # type: ignore[arg-type]
    assert (
        str(info.value)
        == "99-extra.policy:2:6: undefined symbol ksmEnable (set needs a defvar first)"
    )


def test_vdsm_nil_stat_leaves_only_that_guest_out() -> None:
    # vdsm's 04-cputune does not check its stats: in MOM a guest without vcpu_user_limit
    # fails the whole cycle. Here that guest is left out and the others keep their controls
    # (docs/mom-differences.md).
    bad = guest("bad", vcpu_count=2, vcpu_quota=-1, vcpu_period=100_000)
    good = guest("good", vcpu_user_limit=50, vcpu_count=2, vcpu_quota=-1, vcpu_period=100_000)
    files = [VDSM / "00-defines.policy", VDSM / "04-cputune.policy"]
    result = load_policy_files(files).evaluate(host(cpu_count=2), [bad, good])
    assert result.guest_controls == {"good": {"vcpu_quota": 50000.0}}
    reason = result.left_out["bad"]
    assert reason.startswith("policy failed on its nil vcpu_user_limit: 04-cputune.policy:")
    assert "cannot apply < to nil" in reason


def test_vdsm_error_on_a_complete_guest_still_fails_the_cycle() -> None:
    # Nothing was missing, so the policy itself is at fault: as in MOM, no control at all.
    g = guest("g", vcpu_user_limit="fifty", vcpu_count=2, vcpu_quota=-1, vcpu_period=100_000)  # type: ignore[arg-type]
    files = [VDSM / "00-defines.policy", VDSM / "04-cputune.policy"]
    with pytest.raises(PolicyError) as info:
        load_policy_files(files).evaluate(host(cpu_count=2), [g])
    assert info.value.file == "04-cputune.policy"
