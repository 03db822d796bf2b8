"""The policy an agent runs, watched in its directory and reloaded when it changes.

Policy files are loaded one by one (``PolicyDirectory``): a file that does not parse is
reported and the others run, keeping that file's previous version on a hot reload. A
file whose version exceeds an evaluation bound (steps, memory, wall time) is rejected at
run time (``reject``) and the cycle is evaluated again with that file's previous version.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from loadmaster.policy import PolicyError
from loadmaster.policy.engine import PolicyDirectory, read_policy_bytes
from loadmaster.policy.errors import PolicyLimitError
from loadmaster.policy.snapshot import CycleResult, EntitySnapshot

log = logging.getLogger(__name__)


class PolicyLike(Protocol):
    def evaluate(self, host: EntitySnapshot, guests: Sequence[EntitySnapshot]) -> CycleResult: ...


PolicyLoader = Callable[[Path], PolicyLike]


class PolicyWatcher:
    """The policy of a directory, reloaded when a file's mtime, size or name set changes and
    its contents differ.

    By default the files are loaded one by one (``PolicyDirectory``): a file that fails is
    reported in ``errors`` and its previous version, if any, keeps running; the others run.
    With a ``loader`` the directory is loaded as a whole and a policy that fails to load is
    rejected while the previous one stays.
    """

    def __init__(self, directory: Path, loader: PolicyLoader | None = None) -> None:
        self.directory = Path(directory)
        self.loader = loader
        self.files = PolicyDirectory(self.directory) if loader is None else None
        self._stamp: tuple[tuple[str, int, int], ...] | None = None
        self._digest = ""
        self.error: PolicyError | None = None
        self.errors: list[PolicyError] = []
        # Raises PolicyError: an agent that starts with no valid policy must not run.
        self.policy: PolicyLike = self._load()

    def _files(self) -> list[Path]:
        try:
            return sorted(
                p
                for p in self.directory.iterdir()
                if p.name.endswith(".policy") and not p.name.startswith(".")
            )
        except OSError:
            return []

    def _load(self) -> PolicyLike:
        files = self._files()
        stamp = self._stamp_of(files)
        if self.files is not None:
            self.files.reload()
            self._errors_from(self.files)
            if not self.files.running and self.errors:
                raise self.errors[0]
            policy: PolicyLike = self.files.policy
        else:
            assert self.loader is not None
            policy = self.loader(self.directory)
        self._stamp, self._digest = stamp, self._digest_of(files)
        return policy

    def _errors_from(self, files: PolicyDirectory) -> None:
        self.errors = [files.errors[name] for name in sorted(files.errors)]
        self.error = self.errors[0] if self.errors else None

    @staticmethod
    def _stamp_of(files: list[Path]) -> tuple[tuple[str, int, int], ...]:
        stamp = []
        for path in files:
            try:
                st = path.stat()
            except OSError:
                continue
            stamp.append((path.name, st.st_mtime_ns, st.st_size))
        return tuple(stamp)

    @staticmethod
    def _digest_of(files: list[Path]) -> str:
        digest = hashlib.sha256()
        for path in files:
            digest.update(path.name.encode() + b"\0")
            try:
                digest.update(read_policy_bytes(path))
            except PolicyError as exc:
                digest.update(str(exc).encode())
        return digest.hexdigest()

    @property
    def digest(self) -> str:
        """SHA-256 of the policy running: its files' names and contents."""
        return self.files.digest if self.files is not None else self._digest

    def refresh(self) -> bool:
        """True when a new policy was loaded."""
        files = self._files()
        stamp = self._stamp_of(files)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        if self.files is not None:
            try:
                changed = self.files.reload()
            except PolicyError as exc:  # the directory itself is gone: keep what runs
                self.errors, self.error = [exc], exc
                log.error("policy directory unusable, policy kept: %s", exc)
                return False
            self._errors_from(self.files)
            for error in self.errors:
                log.error("policy file refused, its previous version kept: %s", error)
            self.policy = self.files.policy
            if changed:
                log.info("policy reloaded from %s", self.directory)
            return changed
        digest = self._digest_of(files)
        if digest == self._digest:
            return False
        self._digest = digest
        assert self.loader is not None
        try:
            policy = self.loader(self.directory)
        except PolicyError as exc:
            self.error = exc
            self.errors = [exc]
            log.error("policy in %s rejected, previous policy kept: %s", self.directory, exc)
            return False
        self.policy, self.error, self.errors = policy, None, []
        log.info("policy reloaded from %s", self.directory)
        return True

    def reject(self, error: PolicyLimitError) -> bool:
        """Stop running the file version that exceeded a bound; True when another policy
        (that file's previous version, or none of it) is now in place."""
        if self.files is None or not self.files.reject(error):
            return False
        log.error("policy file rejected, its previous version restored: %s", error)
        self._errors_from(self.files)
        self.policy = self.files.policy
        return True

    def cycle_succeeded(self) -> None:
        if self.files is not None:
            self.files.cycle_succeeded()
