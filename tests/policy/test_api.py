"""The entry points the agent and CLI use: loading rules, check_files, eval_files and its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from policy_helpers import MOM_SHAPED

from loadmaster.policy import (
    PolicyError,
    check_files,
    eval_files,
    load_policy_dir,
    shipped_policy_dir,
)
from loadmaster.policy.entities import IO_KEYS


def test_policy_dir_follows_moms_rules(tmp_path: Path) -> None:
    (tmp_path / "20-b.policy").write_text("(defvar b 2)")
    (tmp_path / "10-a.policy").write_text("(defvar a 1)")
    (tmp_path / ".hidden.policy").write_text("(broken")
    (tmp_path / "notes.txt").write_text("(broken")
    (tmp_path / "30-c.policy.policy").write_text("(defvar c 3)")
    policy = load_policy_dir(tmp_path)
    assert [f.name for f in policy.files] == ["10-a", "20-b", "30-c"]
    assert [f.filename for f in policy.files] == [
        "10-a.policy",
        "20-b.policy",
        "30-c.policy.policy",
    ]


def test_missing_directory_and_file() -> None:
    with pytest.raises(PolicyError, match="not a directory"):
        load_policy_dir("/nonexistent/dir")
    (problem,) = check_files(["/nonexistent/x.policy"])
    assert problem.file == "x.policy" and "cannot read" in problem.message


def test_check_files_reports_every_file(tmp_path: Path) -> None:
    (tmp_path / "a.policy").write_text("(defvar x 1)\n(+ 1 2\n")
    (tmp_path / "b.policy").write_text(
        "(if x 1)\n(let (a) 1)\n(def f 3 1)\n(with (g) h 1)\n(- 1)\n"
    )
    (tmp_path / "c.policy").write_text("(defvar ok 1)\n")
    problems = check_files(sorted(tmp_path.glob("*.policy")))
    assert [str(p) for p in problems] == [
        "a.policy:2:1: unclosed '('",
        "b.policy:1:1: if needs an else branch: (if condition then else)",
        "b.policy:2:7: let binding must be (name value)",
        "b.policy:3:8: parameters must be a list of names",
        "b.policy:4:7: with expects a name here",
        "b.policy:5:1: sub takes 2 argument(s), got 1",
    ]


def test_check_files_finds_errors_in_branches_that_rarely_run(tmp_path: Path) -> None:
    path = tmp_path / "x.policy"
    path.write_text("(if 0 (if 1 2) 3)\n(def f () (+ 1))\n(let ((a (Host.a.b))) a)\n")
    assert [(p.line, p.column) for p in check_files([path])] == [(1, 7), (2, 11), (3, 11)]


def test_mom_shaped_and_shipped_policies_check_clean() -> None:
    assert check_files(sorted(MOM_SHAPED.glob("*.policy"))) == []
    assert check_files(sorted(shipped_policy_dir().glob("*.policy"))) == []


SNAPSHOT = {
    "host": {
        "name": "h1",
        "stats": {"mem_available": 16_000_000, "mem_free": 8_000_000, "cpu_count": 4},
        "history": [{"mem_free": 8_000_000}],
        "properties": {"interval": 15},
    },
    "guests": [
        {
            "name": "vm-1",
            "stats": {
                "balloon_cur": 3_000_000,
                "balloon_max": 4_000_000,
                "balloon_min": 1_000_000,
                "mem_unused": 1_000_000,
            },
            "tags": ["platinum"],
        },
        {"name": "vm-2", "stats": {"balloon_cur": None}, "tags": []},
    ],
}


def test_eval_files_returns_json() -> None:
    files = sorted(shipped_policy_dir().glob("*.policy"))
    out = eval_files(files, json.loads(json.dumps(SNAPSHOT)))
    assert json.loads(json.dumps(out)) == out
    assert out["guests"]["vm-1"]["balloon_target"] == 4_000_000
    assert "vm-2" not in out["guests"]
    assert "balloon_cur" in out["missing_stats"]["guests"]["vm-2"]
    assert "ksm_shareable" in out["missing_stats"]["host"]
    assert out["host"] == {}


def test_eval_files_reports_refused_io_tune_and_left_out_guests(tmp_path: Path) -> None:
    policy = tmp_path / "p.policy"
    policy.write_text(
        "(with Guests g {\n"
        '  (g.Control "vcpu_quota" (* 2 g.vcpu_count))\n'
        "  (if (valid g.io_tune) (with g.io_tune t (t.setTotalIopsSec 5)) 0)})"
    )
    limits = dict.fromkeys(["total_bytes_sec", "read_bytes_sec", "write_bytes_sec"], 0)
    snapshot = {
        "guests": [
            {"name": "ok", "stats": {"vcpu_count": 2}},
            {"name": "nil", "stats": {"vcpu_count": None}},
            {
                "name": "short",
                "stats": {"vcpu_count": 1},
                "properties": {"io_tune": [{"name": "vda", "maximum": limits}]},
            },
        ]
    }
    out = eval_files([policy], snapshot)
    # The policy never reads the limit keys the entry lacks: as in MOM, nothing is refused.
    io_request = [
        {"name": "vda", "path": None, "ioTune": {**dict.fromkeys(IO_KEYS), "total_iops_sec": 5}}
    ]
    assert out["guests"] == {
        "ok": {"vcpu_quota": 4},
        "short": {"vcpu_quota": 2, "io_tune": io_request},
    }
    assert out["refused"] == {}
    assert out["left_out"]["nil"].startswith("policy failed on its nil vcpu_count: p.policy:2:")

    # Reading one it lacks refuses that guest's IO tune alone; its other controls stand.
    policy.write_text(
        policy.read_text().replace(
            "(t.setTotalIopsSec 5)",
            "(let ((cap t.maximum)) (t.setTotalIopsSec cap.total_iops_sec))",
        )
    )
    out = eval_files([policy], snapshot)
    assert out["guests"] == {"ok": {"vcpu_quota": 4}, "short": {"vcpu_quota": 2}}
    assert out["refused"] == {
        "short": {
            "io_tune": "io_tune entry 'vda': maximum lacks the limit key total_iops_sec, "
            "which the policy read"
        }
    }


def test_io_tuning_switched_off_clears_limits_of_an_entry_lacking_keys(tmp_path: Path) -> None:
    """MOM's 05-iotune with ioTuneEnabled off lifts every limit without reading the
    policy's, so an entry lacking a key still has its old limits cleared."""
    switch_off = tmp_path / "01-parameters.policy"
    switch_off.write_text("(set ioTuneEnabled 0)")
    files = [*sorted(shipped_policy_dir().glob("*.policy")), switch_off]
    current = {**dict.fromkeys(IO_KEYS, 0), "total_bytes_sec": 1_048_576}
    guest = {
        "name": "vm-1",
        "stats": {},
        "properties": {
            "io_tune": [{"name": "vda", "maximum": {"total_bytes_sec": 0}, "current": current}]
        },
    }
    out = eval_files(files, {"host": {"stats": {}}, "guests": [guest]})
    assert out["refused"] == {}
    assert out["guests"]["vm-1"]["io_tune"] == [
        {"name": "vda", "path": None, "ioTune": dict.fromkeys(IO_KEYS, 0)}
    ]


@pytest.mark.parametrize(
    ("snapshot", "message"),
    [
        ([], "snapshot: expected an object"),
        ({"guests": {}}, "guests: expected a list"),
        ({"guests": [{"stats": {}}]}, "guests[0].name is required"),
        ({"guests": [{"name": ""}]}, "guests[0].name must be a non-empty string"),
        ({"guests": [{"name": "a", "colour": 1}]}, "guests[0].colour is not a field"),
        (
            {"guests": [{"name": "a", "stats": {"x": "1"}}]},
            "guests[0].stats.x must be a finite number",
        ),
        (
            {"guests": [{"name": "a", "stats": {"x": True}}]},
            "guests[0].stats.x must be a finite number",
        ),
        (
            {"guests": [{"name": "a", "history": [{"x": float("inf")}]}]},
            "guests[0].history[0].x must be a finite number",
        ),
        ({"host": {"stats": [], "name": "h"}}, "host.stats must be an object"),
        ({"host": {"history": {}}}, "host.history must be a list"),
        ({"host": {"history": [1]}}, "host.history[0] must be an object"),
        ({"guests": [{"name": "a", "tags": "gold"}]}, "guests[0].tags must be a list"),
        (
            {"guests": [{"name": "a", "properties": {"io_tune": {}}}]},
            "guests[0].properties.io_tune",
        ),
        ({"guests": [{"name": "a"}, {"name": "a"}]}, "two guests are named 'a'"),
    ],
)
def test_bad_snapshots(snapshot: object, message: str) -> None:
    with pytest.raises(PolicyError) as info:
        eval_files([MOM_SHAPED / "00-switches.policy"], snapshot)
    assert info.value.file == "<snapshot>"
    assert message in info.value.message


def test_eval_files_propagates_policy_errors(tmp_path: Path) -> None:
    path = tmp_path / "02-balloon.policy"
    path.write_text("(defvar a 1)\n\n\n\n\n\n\n\n\n\n\n    (+ a foo)\n")
    with pytest.raises(PolicyError) as info:
        eval_files([path], {})
    assert str(info.value) == "02-balloon.policy:12:10: undefined symbol foo"


def test_policy_error_is_a_loadmaster_error() -> None:
    from loadmaster.errors import LoadmasterError

    err = PolicyError("f.policy", 3, 4, "boom")
    assert isinstance(err, LoadmasterError)
    assert err.to_dict()["detail"] == "f.policy:3:4: boom"
    assert str(PolicyError("<snapshot>", 0, 0, "bad")) == "<snapshot>: bad"
