"""Every option loadmaster reads from its environment, in one place.

Each option is read from ``LOADMASTER_<NAME>`` (``db`` from ``LOADMASTER_DB``); a command
line option, where one exists, wins over the variable. ``loadmaster settings`` prints them
all with their values and what they do, and docs/configuration.md lists them. Nothing else
in loadmaster reads the environment: the server, the CLI and the Python API take their
values from ``settings_model.load_settings()``, a pydantic-settings object.

This module stays light (no pydantic): the CLI imports it at every start, for the
variable names and defaults of its options, and loads the model only when it needs it.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadmaster.errors import ValidationError

PREFIX = "LOADMASTER_"
# The largest token or policies file read: far beyond any real one, small enough that a
# wrong path (a log, an image) is refused rather than held in memory.
MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class Option:
    default: Any
    description: str


OPTIONS = {
    "db": Option(
        "sqlite:///loadmaster.db",
        "database URL: sqlite:///FILE (the embedded default) or "
        "postgresql+psycopg://USER@HOST:PORT/DB when several processes share one state",
    ),
    "url": Option("http://127.0.0.1:8080", "the API address remote CLI commands talk to"),
    "token": Option(None, "bearer token the CLI and the host agent present to the API"),
    "tokens": Option(
        "",
        "the server's tokens inline, token:role,... (roles: admin, reader, member, "
        "agent:<host>); a token file (tokens_file) is the better place",
    ),
    "tokens_file": Option(
        None, "the server's token file (.toml/.yaml/.json: [tokens] TOKEN = ROLE)"
    ),
    "no_auth": Option(False, "serve without tokens (local use only)"),
    "tls_cert": Option(
        None,
        "PEM certificate this process presents: serve's server certificate (it then serves "
        "HTTPS; read again on SIGHUP), an agent's client certificate naming its host",
    ),
    "tls_key": Option(None, "the private key of tls_cert (PEM; default: in tls_cert's file)"),
    "tls_client_ca": Option(
        None,
        "serve: PEM file of the CA that signs agents' client certificates; a verified client "
        "certificate naming host H authenticates as role agent:H, without a token",
    ),
    "ca": Option(
        None,
        "PEM file of the CA the CLI and the agent verify an https:// API's certificate "
        "against (default: the system's trust store)",
    ),
    "max_body": Option(1024 * 1024, "largest request body the server accepts, in bytes"),
    "agent_silent_after": Option(
        60.0,
        "seconds without a word from a host's agent before the host and its VMs are shown "
        "as silent and the scheduler stops choosing the host (their claims are kept)",
    ),
    "agent_heard_every": Option(
        10.0,
        "seconds between the server's records of a live agent whose long-poll it holds; "
        "agent_silent_after must be at least twice this plus its flush (24 s by default), "
        "so that a live agent never looks silent",
    ),
    "pending_warn_after": Option(
        300.0,
        "seconds a claim may stay pending on a host whose agent is silent or absent before "
        "vm list, host show and audit warn about it (the claim is kept)",
    ),
    "fence_command": Option(
        "",
        "command that powers a host off, run with the host's name as its last argument "
        "(exit 0: fenced); once set, the server fences a host whose agent is silent past "
        "agent_silent_after and evacuates its VMs (docs/operators-guide.md, When a host dies)",
    ),
    "fence_timeout": Option(60.0, "seconds the fence command may take before it counts as failed"),
    "scheduler_policy": Option("spread", "the scheduling policy used when a request names none"),
    "policies_file": Option(
        None,
        "TOML file of scheduling policies, [policies.NAME] with weighers, filters and "
        "disabled_filters (see docs/configuration.md)",
    ),
    "unknown_specs": Option(
        "refuse",
        "flavor extra specs loadmaster does not know: refuse the flavor, or warn and ignore them",
    ),
    "pci_aliases": Option(
        "",
        "the PCI aliases flavors ask host devices by (pci_passthrough:alias=NAME:N), a JSON "
        'list: [{"name": "vf1", "resource_class": "CUSTOM_VF"} or with vendor_id and '
        'product_id, and "traits"]',
    ),
    "scheduling_dir": Option(
        None,
        "set by serve --workers N for its workers: the private directory of the one "
        "scheduling process they hand placements to (docs/architecture.md); unset, each "
        "process decides its own",
    ),
    "fast_statements": Option(
        True,
        "the hot paths run their statements on the database driver's cursor, compiled once; "
        "false: through SQLAlchemy's own execution (slower, the same results), to rule the "
        "fast path out when chasing a fault",
    ),
    "randomize_allocation_candidates": Option(
        False,
        "GET /allocation_candidates shuffles its answer (Placement's option of that name), so "
        "schedulers that take the first candidate do not all pick the same host",
    ),
}


def env_name(option: str) -> str:
    """The variable an option is read from."""
    if option not in OPTIONS:
        raise KeyError(option)
    return PREFIX + option.upper()


def default(option: str) -> Any:
    return OPTIONS[option].default


def read_operator_file(path: str | Path, field: str, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a file a setting names (tokens, policies), refused with an error
    naming the file and ``field`` unless it is a regular file of at most ``limit`` bytes:
    a FIFO would block the reader until something writes to it, a device such as
    /dev/zero never ends. ``OSError`` when it cannot be opened."""
    # Non-blocking: opening a FIFO does not wait for a writer (reads of a file ignore it).
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as opened:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValidationError(f"{path}: not a regular file", field=field)
        data = opened.read(limit + 1)
    if len(data) > limit:
        raise ValidationError(f"{path}: larger than {limit} bytes", field=field)
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise ValidationError(f"{path}: not UTF-8 text ({exc})", field=field) from exc
