"""``serve --workers N`` overrides uvicorn's multiprocess supervisor's internals, all in
``api/uvicorn_workers.py``: these tests pin the uvicorn they were written against, and
fail by name on another one, before a server misbehaves under it."""

from __future__ import annotations

import hashlib
import inspect

import uvicorn
from uvicorn.supervisors import multiprocess

from loadmaster.api.uvicorn_workers import PINNED_UVICORN, Supervisor, Worker

# sha256 of uvicorn/supervisors/multiprocess.py's source as of PINNED_UVICORN.
MULTIPROCESS_SHA256 = "53541976227fec0b9ace2c7a5ce8f592ed0d8ff37f3c93c2a18baae9236365c2"
REREAD = (
    "read api/uvicorn_workers.py's overrides again against uvicorn.supervisors.multiprocess, "
    "then move PINNED_UVICORN and MULTIPROCESS_SHA256"
)
# What uvicorn's classes have that the overrides replace, and what its main loop must
# call for them to run: the supervisor's hooks, and the worker's entry point and server.
OVERRIDDEN = {
    Supervisor: (
        "__init__",
        "init_processes",
        "keep_subprocess_alive",
        "join_all",
        "handle_hup",
        "handle_ttin",
    ),
    Worker: ("__init__", "target", "server"),
}
CALLED_BY_THE_MAIN_LOOP = (
    "self.init_processes()",
    "self.keep_subprocess_alive()",
    "self.join_all()",
    "self.handle_signals()",
)


def test_uvicorn_is_the_version_the_overrides_were_written_against() -> None:
    assert uvicorn.__version__ == PINNED_UVICORN, (
        f"uvicorn {uvicorn.__version__}, not {PINNED_UVICORN}: {REREAD}"
    )


def test_uvicorns_supervisor_is_the_source_the_overrides_were_read_against() -> None:
    digest = hashlib.sha256(inspect.getsource(multiprocess).encode()).hexdigest()
    assert digest == MULTIPROCESS_SHA256, f"uvicorn's multiprocess.py changed: {REREAD}"


def test_each_override_replaces_what_uvicorn_has_and_calls() -> None:
    for cls, names in OVERRIDDEN.items():
        (base,) = cls.__bases__
        assert base.__module__ == multiprocess.__name__
        for name in names:
            assert name in vars(cls), (cls, name)
            assert hasattr(base, name), f"uvicorn's {base.__name__} has no {name}: {REREAD}"
    # The hooks take what uvicorn passes them.
    for name in OVERRIDDEN[Supervisor][1:]:
        ours = inspect.signature(getattr(Supervisor, name))
        theirs = inspect.signature(getattr(multiprocess.Multiprocess, name))
        assert list(ours.parameters) == list(theirs.parameters), (name, REREAD)
    run = inspect.getsource(multiprocess.Multiprocess.run)
    for call in CALLED_BY_THE_MAIN_LOOP:
        assert call in run, f"uvicorn's main loop no longer makes {call}: {REREAD}"
    # SIGHUP and SIGTTIN reach ``handle_<signal>`` by name.
    assert 'getattr(self, f"handle_{sig_name.lower()}"' in inspect.getsource(
        multiprocess.Multiprocess.handle_signals
    ), REREAD
