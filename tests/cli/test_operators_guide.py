"""docs/operators-guide.md, run: every ``$ command`` of its ``console`` blocks in order,
in an empty directory, against the server the guide itself starts. A command must end
with the ``[exit N]`` written under it (0 when none is) and print every other line
written under it (table borders and padding ignored). Ports 8080 and 8443 (its HTTPS
server) in the guide become free ports; ``export`` lines set the environment of the commands after them; a command
ending in ``&`` runs in the background until the end. The PostgreSQL commands of the
guide are prose, outside console blocks: they need a PostgreSQL server."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cli_helpers import ROOT, free_port, stop_server, wait_until_healthy

GUIDE = ROOT / "docs" / "operators-guide.md"
BORDERS = re.compile(r"[│┃┏┓┗┛┡┩┢┪└┘┌┐├┤┬┴┼━─╇╈╋┳┻]+")


@dataclass
class Step:
    command: str
    exit_code: int = 0
    expected: list[str] = field(default_factory=list)


def steps(text: str) -> list[Step]:
    found: list[Step] = []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.DOTALL):
        for line in block.splitlines():
            if line.startswith("$ "):
                found.append(Step(line[2:]))
            elif (code := re.fullmatch(r"\[exit (\d+)\]", line.strip())) is not None:
                found[-1].exit_code = int(code.group(1))
            elif line.strip():
                found[-1].expected.append(line)
    return found


def flat(text: str) -> str:
    return " ".join(BORDERS.sub(" ", text).split())


def test_the_guide_parses() -> None:
    parsed = steps(GUIDE.read_text())
    assert len(parsed) > 40
    assert any(s.command.startswith("loadmaster serve") for s in parsed)
    assert any(s.exit_code == 4 for s in parsed)
    assert all(
        s.command.split()[0] in {"loadmaster", "printf", "export", "cp", "curl", "openssl"}
        for s in parsed
    )


def test_every_command_of_the_guide(tmp_path: Path) -> None:
    port, tls_port = str(free_port()), str(free_port())
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOADMASTER_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    background: list[subprocess.Popen[str]] = []
    try:
        for step in steps(GUIDE.read_text()):
            command = step.command.replace("8080", port).replace("8443", tls_port)
            if command.startswith("export "):
                for assignment in shlex.split(command)[1:]:
                    key, _, value = assignment.partition("=")
                    env[key] = value
                continue
            if command.endswith("&"):
                served = tls_port if "--tls-cert" in command else port
                background.append(start(command.rstrip("& "), tmp_path, env, served))
                continue
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            output = flat(done.stdout + done.stderr)
            assert done.returncode == step.exit_code, f"{command}\n{done.stdout}{done.stderr}"
            for line in step.expected:
                line = line.replace("8080", port).replace("8443", tls_port)
                assert flat(line) in output, (
                    f"{command}: {line!r} not in\n{done.stdout}{done.stderr}"
                )
    finally:
        for process in background:
            stop_server(process)


def start(command: str, cwd: Path, env: dict[str, str], port: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        ["bash", "-c", f"exec {command}"],
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return wait_until_healthy(process, port, https="--tls-cert" in command)


def test_the_drain_section_names_the_vm_its_run_leaves() -> None:
    """The prose says which VM cannot move; the run checks the name, not only a count."""
    section = GUIDE.read_text().split("## Drain a host for maintenance", 1)[1].split("\n## ", 1)[0]
    prose, _, block = section.partition("```console")
    drain = next(
        s for s in steps(f"```console{block}") if s.command.startswith("loadmaster host drain")
    )
    stuck = [
        m.group(1) for line in drain.expected if (m := re.match(r"VM (\S+) fits nowhere", line))
    ]
    assert stuck, f"the drain's output in the guide names no VM left: {drain.expected}"
    assert re.search(rf"`{re.escape(stuck[0])}` cannot move", prose), prose


def test_the_flavor_section_names_every_extra_spec_applied() -> None:
    """The guide once said only trait: specs are applied while hw:cpu_policy=dedicated
    turned VCPU into PCPU; its console block now runs that flavor and checks PCPU."""
    section = GUIDE.read_text().split("## Flavors and extra specs", 1)[1].split("\n## ", 1)[0]
    prose = " ".join(section.partition("```console")[0].split())
    for applied in (
        "trait:NAME=required|forbidden",
        "resources:CLASS=N",
        "member_of",
        "hw:cpu_policy=dedicated",
        "hw:mem_page_size=small|any",
        "hw:numa_nodes=1",
    ):
        assert applied in prose, applied
    assert "other keys are stored and shown" not in prose
    pinned = next(s for s in steps(section) if "hw:cpu_policy=dedicated" in s.command)
    assert any("PCPU=2" in line for line in pinned.expected)
