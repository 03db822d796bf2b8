"""Commands that run on a host: the agent, what its journal says it applied, and the
simulated host under memory pressure. Heavy packages are imported inside each command."""

from __future__ import annotations

import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from loadmaster.cli.app import TlsKeyOpt, app
from loadmaster.cli.client import Exit, err_console, exit_code_for, fail
from loadmaster.cli.output import JsonOpt, show
from loadmaster.errors import LoadmasterError
from loadmaster.logs import LogFormat, logging_to
from loadmaster.settings import OPTIONS, env_name


@app.command("agent")
def agent(
    hypervisor: Annotated[str, typer.Option(help="libvirt URI, e.g. qemu:///system")],
    policy_dir: Annotated[Path, typer.Option(help="directory of *.policy files")],
    driver: Annotated[
        str | None,
        typer.Option(
            help="hypervisor driver, an entry of loadmaster.hypervisors (default: host.driver "
            "in --config, else libvirt)"
        ),
    ] = None,
    interval: Annotated[float, typer.Option(help="seconds between cycles")] = 15.0,
    url: Annotated[
        str | None,
        typer.Option(
            "--url", help="loadmaster API to register with and report to (none: SLA policy only)"
        ),
    ] = None,
    api_alias: Annotated[
        str | None, typer.Option("--api", hidden=True, help="deprecated name of --url")
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(envvar=env_name("token"), help="the agent's token (role agent:<host>)"),
    ] = None,
    ca: Annotated[
        Path | None,
        typer.Option(envvar=env_name("ca"), help=OPTIONS["ca"].description),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            envvar=env_name("tls_cert"),
            help="client certificate (PEM) naming this host, presented to an https:// API "
            "started with --tls-client-ca; it stands for --token",
        ),
    ] = None,
    tls_key: TlsKeyOpt = None,
    host_name: Annotated[str | None, typer.Option(help="default: this machine's name")] = None,
    cycles: Annotated[int | None, typer.Option(help="stop after N cycles")] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            help="journal every applied control here, e.g. /var/lib/loadmaster/agent "
            "(see agent-journal); default: no journal"
        ),
    ] = None,
    sys_root: Annotated[
        Path | None,
        typer.Option(
            help="where KSM is written (<root>/kernel/mm/ksm); default: /sys for a real "
            "hypervisor, in memory for the test driver (test:///...)"
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="the host's resource configuration (TOML: [host], [reserved], "
            "[allocation_ratio], [resources]); see loadmaster.agent.manager.ManagerConfig",
        ),
    ] = None,
    collectors: Annotated[
        str | None,
        typer.Option(
            help="collector set, as MOM's [host]/[guest] collectors: vdsm, mom-libvirt or "
            "loadmaster (default), or collector names separated by commas (MOM's, such as "
            "HostMemory,GuestBalloon, or any registered in loadmaster.host_collectors / "
            "loadmaster.guest_collectors); it decides which fields policies can read"
        ),
    ] = None,
    guest_kernel: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="kernel the guests it launches on QEMU boot directly (with --guest-initrd; "
            "e.g. from scripts/guest-image.sh); not needed on the test driver",
        ),
    ] = None,
    guest_initrd: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="their initramfs")
    ] = None,
    guest_console_dir: Annotated[
        Path | None,
        typer.Option(
            file_okay=False, help="append each guest's serial console to <dir>/<name>.serial"
        ),
    ] = None,
    pool_dir: Annotated[
        Path | None,
        typer.Option(
            file_okay=False,
            help="directory of the libvirt storage pool 'loadmaster' holding guests' disks "
            "and base images, as libvirtd sees it; created when missing (default "
            "/var/lib/libvirt/images/loadmaster); its size is the host's DISK_GB",
        ),
    ] = None,
    pool_shared: Annotated[
        str | None,
        typer.Option(
            "--pool-shared",
            metavar="NAME",
            help="the pool's directory is one storage every host sees at that path (an NFS "
            "export, a cluster filesystem), declared so, with one NAME, on each of them: a "
            "live migration leaves the guest's disk in place instead of copying it, and the "
            "pool is one DISK_GB provider NAME the hosts share, not one per host",
        ),
    ] = None,
    image_dir: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            file_okay=False,
            help="where base images come from: <dir>/<image>.qcow2 is copied into the pool "
            "the first time a guest on this host needs it",
        ),
    ] = None,
    migration_data_uri: Annotated[
        str | None,
        typer.Option(
            help="where destination QEMUs listen for live-migration data, tcp://ADDRESS "
            "(e.g. tcp://127.0.0.1 when all hosts are this machine); default: the "
            "destination's host name. Not the libvirt URI other hosts reach this one by "
            "(that is host.migration_uri in --config)"
        ),
    ] = None,
    log_format: Annotated[
        LogFormat,
        typer.Option(
            help="text: one line an event, UTC time first; json: one JSON object a line, "
            "as the server writes"
        ),
    ] = "text",
) -> None:
    """Run the host agent. With --url it is the host's manager: it registers the host with
    the inventory it discovers, launches, moves and removes guests as the scheduler placed
    them, and reports; always, it applies the SLA policy every --interval. Its log (on
    stderr) has a line for each launch, refusal, migration and removal it carries out and
    for each SLA cycle that acted or failed; quiet cycles write nothing."""
    import logging

    from loadmaster.agent import run_agent
    from loadmaster.agent.hypervisor import GuestImage
    from loadmaster.agent.hypervisor.storage import DEFAULT_POOL_DIR, StorageConfig
    from loadmaster.agent.sla import CycleReport
    from loadmaster.agent.sla.collectors import collector_selection
    from loadmaster.agent.sla.narration import CycleNarrator
    from loadmaster.apiclient import ApiError, ApiUnreachable, ClientTls, TlsSetupError

    if url is not None and api_alias is not None and url != api_alias:
        fail("--api is the old name of --url: give one of them", Exit.USAGE)
    api_url = url or api_alias
    if collectors is not None:
        try:
            collector_selection(collectors)
        except ValueError as exc:
            fail(f"--collectors: {exc}", Exit.USAGE)
    if (guest_kernel is None) != (guest_initrd is None):
        fail("--guest-kernel and --guest-initrd go together", Exit.USAGE)
    image = None
    if guest_kernel is not None and guest_initrd is not None:
        image = GuestImage(
            kernel=guest_kernel.resolve(),
            initrd=guest_initrd.resolve(),
            log_dir=guest_console_dir.resolve() if guest_console_dir else None,
        )
    storage = StorageConfig(
        pool_dir=pool_dir.absolute() if pool_dir else DEFAULT_POOL_DIR,
        image_dir=image_dir.resolve() if image_dir else None,
        shared=pool_shared,
    )
    narrator = CycleNarrator()
    cycles_log = logging.getLogger("loadmaster.agent.cycles")

    def narrate(report: CycleReport) -> None:
        narrator.log(report, datetime.now(UTC), cycles_log)

    # Plain lines, never wrapped: they end up in journald and in grep.
    with logging_to(sys.stderr, log_format):
        try:
            run_agent(
                hypervisor,
                policy_dir,
                interval,
                api_url,
                token,
                host_name,
                cycles,
                state_dir,
                sys_root,
                config,
                collectors=collectors,
                guest_image=image,
                migration_data_uri=migration_data_uri,
                storage=storage,
                on_cycle=narrate,
                driver=driver,
                tls=ClientTls(ca, tls_cert, tls_key),
            )
        except TlsSetupError as exc:
            fail(str(exc), Exit.USAGE)
        except LoadmasterError as exc:
            fail(exc.detail, Exit.SERVER_ERROR)
        except ApiUnreachable as exc:
            fail(str(exc), Exit.UNREACHABLE)
        except ApiError as exc:
            fail(str(exc), exit_code_for(exc.status))


@app.command("agent-journal")
def agent_journal(
    state_dir: Annotated[
        Path, typer.Option(exists=True, file_okay=False, help="the agent's --state-dir")
    ],
    as_json: JsonOpt = False,
) -> None:
    """What the agent's journal says it applied: the last value of every control, and the
    cycles that started but never ended (an agent killed mid-cycle). The hypervisor may be
    one call ahead of an interrupted cycle, never behind the journal."""
    from loadmaster.agent.sla import read_journal
    from loadmaster.agent.sla.journal import agent_running

    try:
        state = read_journal(state_dir)
    except LoadmasterError as exc:
        fail(exc.detail, Exit.SERVER_ERROR)
    running = agent_running(state_dir)
    records = sorted(state.last.values(), key=lambda r: (r.target, r.control))
    data = {
        "agent_running": running,
        "cycles_ended": state.cycles_ended,
        "torn_bytes": state.torn_bytes,
        "applied": [asdict(r) for r in records],
        "interrupted": [asdict(c) for c in state.interrupted],
        "open_cycle": None if state.open_cycle is None else asdict(state.open_cycle),
    }
    rows = [(r.target, r.control, r.value, r.cycle, _when(r.time)) for r in records]
    title = (
        f"Applied controls ({state.cycles_ended} cycles ended, "
        f"agent {'running' if running else 'not running'})"
    )
    show(data, as_json, title, ("target", "control", "value", "cycle", "applied at"), rows)
    if as_json or not state.interrupted:
        return
    in_progress = state.open_cycle if running else None
    cycles = [
        (c.cycle, _when(c.started), c.applied, c.policy[:12], c is in_progress)
        for c in state.interrupted
    ]
    columns = ("cycle", "started", "journalled", "policy", "in progress")
    show(data, False, "Cycles that never ended", columns, cycles)


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds")


@app.command("simulate-host")
def simulate_host(
    guests: Annotated[int, typer.Option(help="guests on the simulated host")] = 40,
    steps: Annotated[int, typer.Option(help="policy cycles to simulate")] = 120,
    seed: Annotated[int, typer.Option(help="random seed of the guests' demand")] = 1,
    out: Annotated[Path, typer.Option(help="where CSV, PNG and HTML go")] = Path("simulation"),
) -> None:
    """Simulate one host under memory pressure, with and without the shipped policies."""
    from loadmaster.demo.simulation import simulate_host as simulate

    result = simulate(guests, steps, seed, out)
    for label, value in result.figures():
        err_console().print(f"{label}: {value}", markup=False)
    err_console().print(f"report: {result.html_path}", markup=False)
