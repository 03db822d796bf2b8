"""Runs a Markdown guide's shell sessions, so the guide cannot drift from the behaviour.

In the guide:

* a ```console block holds commands (``$ ...``, continued with a trailing backslash) each
  followed by the output it must show: every non-blank line of it must appear in what the
  command printed, with runs of spaces collapsed (``...`` stands for lines left out);
* ``# exit N`` at the end of a command says it must exit with N (bash ignores it);
* ``export NAME=VALUE`` sets a variable for the commands after it;
* a command ending in ``&`` keeps running in the background until the guide ends;
* a fenced block right after ``<!-- write: PATH -->`` is written to PATH first.

Commands run with bash, one after another, in one working directory. The guide's port
8080 becomes a free one, so runs never collide with other servers on the machine.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

GUIDE_PORT = "8080"


@dataclass
class Step:
    line: int
    command: str = ""
    expected: list[str] = field(default_factory=list)
    write_path: str | None = None
    content: str = ""


def parse(text: str) -> list[Step]:
    steps: list[Step] = []
    lines = text.splitlines()
    i = 0
    write_to: str | None = None
    while i < len(lines):
        marker = re.fullmatch(r"<!-- write: (\S+) -->", lines[i].strip())
        if marker:
            write_to = marker.group(1)
            i += 1
            continue
        fence = re.match(r"^```(\w*)", lines[i])
        if not fence:
            i += 1
            continue
        start = i + 1
        end = next(j for j in range(start, len(lines)) if lines[j].startswith("```"))
        body = lines[start:end]
        if write_to is not None:
            steps.append(Step(start, write_path=write_to, content="\n".join(body) + "\n"))
            write_to = None
        elif fence.group(1) == "console":
            steps.extend(_session(body, start))
        i = end + 1
    return steps


def _session(body: list[str], first_line: int) -> Iterator[Step]:
    step: Step | None = None
    continued = False
    for offset, line in enumerate(body):
        if continued and step is not None:
            step.command += "\n" + line
            continued = line.endswith("\\")
            continue
        if line.startswith("$ "):
            if step is not None:
                yield step
            step = Step(first_line + offset + 1, command=line[2:])
            continued = line.endswith("\\")
        elif step is not None and line.strip() and line.strip() != "...":
            step.expected.append(line)
    if step is not None:
        yield step


def collapse(text: str) -> str:
    return " ".join(text.split())


class GuideRun:
    def __init__(self, workdir: Path, bin_dir: Path, port: int) -> None:
        self.workdir = workdir
        self.port = str(port)
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("LOADMASTER_", "COLUMNS"))
        }
        self.env["PATH"] = f"{bin_dir}{os.pathsep}{self.env['PATH']}"
        self.env["COLUMNS"] = "200"
        self.background: list[subprocess.Popen[bytes]] = []

    def _local(self, text: str) -> str:
        return text.replace(GUIDE_PORT, self.port)

    def run(self, step: Step) -> None:
        if step.write_path is not None:
            target = self.workdir / step.write_path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(self._local(step.content))
            return
        command = self._local(step.command)
        exported = re.fullmatch(r"export (\w+)=(.*)", command.strip())
        if exported:
            self.env[exported.group(1)] = shlex.split(exported.group(2))[0]
            return
        where = f"guide line {step.line}: {step.command}"
        if command.rstrip().endswith("&"):
            self.background.append(
                subprocess.Popen(
                    ["bash", "-c", f"exec {command.rstrip()[:-1]}"],
                    cwd=self.workdir,
                    env=self.env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            return
        wanted = re.search(r"#\s*exit (\d+)\s*$", command)
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        output = done.stdout + done.stderr
        code = int(wanted.group(1)) if wanted else 0
        assert done.returncode == code, f"{where}\nexit {done.returncode}, wanted {code}\n{output}"
        assert "Traceback" not in output, f"{where}\n{output}"
        seen = collapse(output)
        for line in step.expected:
            assert collapse(self._local(line)) in seen, f"{where}\nmissing {line!r} in\n{output}"

    def close(self) -> None:
        for process in self.background:
            process.terminate()
        for process in self.background:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
