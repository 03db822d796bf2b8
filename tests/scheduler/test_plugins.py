"""A third party adds a filter and a weigher through entry points, without touching
loadmaster: a fake installed distribution on sys.path is all it takes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from tests.scheduler.conftest import add_hosts, small_flavor

from loadmaster.errors import ValidationError
from loadmaster.scheduler import Policy, RequestSpec, Scheduler, WeigherSetting
from loadmaster.service import Loadmaster

PLUGIN = '''
import numpy as np


class OddHostsOut:
    """A per-host filter: it never heard of numpy masks."""

    name = "odd_hosts_out"

    def filter(self, host, request):
        return "odd host number" if int(host.name[1:]) % 2 else None


class BigVmsOnLowHosts:
    """Static (it ignores the batch's claims) but reads ``resources``, a field no stock
    static filter reads: it declares no ``reads``, so it must be asked every time."""

    name = "big_vms_on_low_hosts"
    dynamic = False
    order = 45

    def mask(self, hosts, request):
        if request.resources.get("VCPU", 0) < 4:
            return None
        from loadmaster.scheduler.core.plugins import Verdict

        low = np.array([int(n[1:]) < 2 for n in hosts.names])
        return Verdict.one_reason(low, "big VMs go to h0 and h1")


class LastHostFirst:
    name = "last_host_first"

    def weigh(self, hosts, request, candidates):
        return np.array([float(hosts.names[c][1:]) for c in candidates])
'''


@pytest.fixture
def third_party(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "lm_extras.py").write_text(textwrap.dedent(PLUGIN))
    dist = tmp_path / "lm_extras-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lm-extras\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[loadmaster.filters]\nodd_hosts_out = lm_extras:OddHostsOut\n"
        "big_vms_on_low_hosts = lm_extras:BigVmsOnLowHosts\n\n"
        "[loadmaster.weighers]\nlast_host_first = lm_extras:LastHostFirst\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))


def test_third_party_filter_and_weigher(slm: Loadmaster, third_party: None) -> None:
    add_hosts(slm, 6)
    small_flavor(slm)
    policy = Policy("last", "highest host number first", (WeigherSetting("last_host_first", 1.0),))
    scheduler = Scheduler(slm.store, policies={"last": policy})
    result = scheduler.schedule([RequestSpec(flavor="small")], dry_run=True, policy="last")
    assert result.placements[0].host == "h4"  # h5 is odd, the highest even one wins
    explanation = scheduler.explain(RequestSpec(flavor="small", exclude_hosts=["h0"]))
    assert explanation.candidates == 2
    assert {f.filter: f.reasons for f in explanation.filters} == {
        "hosts": {"excluded (where the VM runs, or by the request)": 1},
        "odd_hosts_out": {"odd host number": 3},
    }


def test_unknown_weigher_in_a_policy_is_named(slm: Loadmaster) -> None:
    add_hosts(slm, 1)
    small_flavor(slm)
    scheduler = Scheduler(
        slm.store, policies={"bad": Policy("bad", "", (WeigherSetting("nonesuch"),))}
    )
    with pytest.raises(Exception, match="nonesuch"):
        scheduler.schedule([RequestSpec(flavor="small")], dry_run=True, policy="bad")


def test_a_static_filter_that_declares_no_reads_is_never_answered_from_the_cache(
    slm: Loadmaster, third_party: None
) -> None:
    """Two requests alike in every field the stock static filters read, unlike in the one
    the third-party filter reads, in one batch: each gets its own verdict."""
    add_hosts(slm, 6)
    small_flavor(slm)
    small_flavor(slm, "big", vcpu=4)
    policy = Policy("last", "", (WeigherSetting("last_host_first", 1.0),))
    scheduler = Scheduler(slm.store, policies={"last": policy})
    result = scheduler.schedule(
        [RequestSpec(flavor="small"), RequestSpec(flavor="big"), RequestSpec(flavor="small")],
        dry_run=True,
        policy="last",
    )
    assert [p.host for p in result.placements] == ["h4", "h0", "h4"]


def test_a_policy_switches_a_filter_off_by_name(slm: Loadmaster, third_party: None) -> None:
    add_hosts(slm, 6)
    small_flavor(slm)
    weighers = (WeigherSetting("last_host_first", 1.0),)
    policies = {
        "all": Policy("all", "", weighers),
        "odd-ok": Policy("odd-ok", "", weighers, disabled_filters=("odd_hosts_out",)),
        "bad": Policy("bad", "", weighers, disabled_filters=("nonesuch",)),
    }
    scheduler = Scheduler(slm.store, policies=policies)
    chosen = {
        name: scheduler.schedule([RequestSpec(flavor="small")], dry_run=True, policy=name)
        .placements[0]
        .host
        for name in ("all", "odd-ok")
    }
    assert chosen == {"all": "h4", "odd-ok": "h5"}
    with pytest.raises(ValidationError, match="disables filter 'nonesuch'"):
        scheduler.schedule([RequestSpec(flavor="small")], dry_run=True, policy="bad")
