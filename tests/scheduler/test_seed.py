"""A seed replays a decision: a dry run and the real run with the same seed on the same
state choose the same hosts, and every result says which seed it used."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.scheduler.conftest import add_hosts, add_vms, small_flavor

import loadmaster
from loadmaster.cluster import VmSpec
from loadmaster.errors import ValidationError
from loadmaster.scheduler import RequestSpec
from loadmaster.service import Loadmaster


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    vcpus=st.lists(st.integers(2, 16), min_size=1, max_size=8),
    vms=st.lists(st.sampled_from(["tiny", "small", "big"]), min_size=1, max_size=20),
    policy=st.sampled_from(["spread", "pack", "vm-count"]),
    gang=st.booleans(),
    seed=st.integers(0, 2**63 - 1),
)
def test_a_dry_run_and_the_real_run_with_one_seed_choose_the_same_hosts(
    vcpus: list[int], vms: list[str], policy: str, gang: bool, seed: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        lm = loadmaster.open(f"sqlite:///{Path(tmp) / 's.db'}")
        try:
            # Equal hosts make many ties: exactly where the random draw decides.
            lm.hosts.create_many(
                [
                    {
                        "name": f"h{i}",
                        "inventories": {"VCPU": {"total": v}, "MEMORY_MB": {"total": 8192}},
                    }
                    for i, v in enumerate(vcpus)
                ]
            )
            for name, vcpu in (("tiny", 1), ("small", 2), ("big", 4)):
                lm.flavors.create({"name": name, "resources": {"VCPU": vcpu, "MEMORY_MB": 512}})
            uuids = [
                v.uuid for v in lm.vms.create_many([VmSpec(f"vm{i}", f) for i, f in enumerate(vms)])
            ]
            request = [RequestSpec(vms=uuids)]
            dry = lm.scheduler.schedule(request, dry_run=True, policy=policy, gang=gang, seed=seed)
            # Other calls in between must not shift the real run's draws.
            lm.scheduler.schedule(request, dry_run=True, policy=policy, gang=gang)
            real = lm.scheduler.schedule(request, policy=policy, gang=gang, seed=seed)
            assert [p.host for p in real.placements] == [p.host for p in dry.placements]
            assert dry.seed == real.seed == seed
        finally:
            lm.close()


def test_a_result_records_its_seed_and_replaying_it_repeats_the_choices(
    slm: Loadmaster,
) -> None:
    add_hosts(slm, 30)
    small_flavor(slm)
    uuids = add_vms(slm, 10)
    first = slm.scheduler.schedule([RequestSpec(vms=uuids)], dry_run=True)
    assert isinstance(first.seed, int) and first.to_dict()["seed"] == first.seed
    again = slm.scheduler.schedule([RequestSpec(vms=uuids)], dry_run=True, seed=first.seed)
    assert again.placed == first.placed
    # Thirty equal hosts: without the seed, ten draws would not repeat by chance.
    others = [
        slm.scheduler.schedule([RequestSpec(vms=uuids)], dry_run=True).placed for _ in range(3)
    ]
    assert any(o != first.placed for o in others)


@pytest.mark.parametrize("seed", [-1, 2**63, 1.5, True])
def test_a_bad_seed_is_refused_naming_it(slm: Loadmaster, seed: object) -> None:
    add_hosts(slm, 2)
    small_flavor(slm)
    uuids = add_vms(slm, 1)
    with pytest.raises(ValidationError) as caught:
        slm.scheduler.schedule([RequestSpec(vms=uuids)], seed=seed)  # type: ignore[arg-type]
    assert caught.value.field == "seed"
    assert slm.vms.get(uuids[0]).state == "requested"


def test_a_drain_records_the_seed_of_its_decision(slm: Loadmaster) -> None:
    add_hosts(slm, 3)
    small_flavor(slm)
    uuids = add_vms(slm, 2)
    slm.scheduler.schedule([RequestSpec(vms=uuids, include_hosts=["h0"])])
    drained = slm.maintenance.drain("h0")
    assert len(drained.moved) == 2
    assert isinstance(drained.seed, int) and drained.to_dict()["seed"] == drained.seed
