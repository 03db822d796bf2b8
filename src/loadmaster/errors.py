"""Errors every layer raises; the API turns them into ``{code, title, detail}`` JSON.

Each error carries a machine-readable ``code`` (stable, dotted, like Placement's
``placement.concurrent_update``), the ``field`` it is about when there is one, and a
human sentence. They know nothing of HTTP: the API maps them to status codes in one table
(``api/errors.py::STATUS_OF``), the CLI to exit codes.
"""

from __future__ import annotations


class LoadmasterError(Exception):
    code = "loadmaster.error"
    title = "Error"

    def __init__(
        self, detail: str, *, field: str | None = None, placement_detail: str | None = None
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field
        # Placement's words for the same error, answered on its routes (its clients and
        # tests match them) where loadmaster's own say it as an operator would.
        self.placement_detail = placement_detail

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuilt from its attributes, not by calling the class with ``args`` as pickle
        # does for exceptions: subclasses take other arguments (the scheduling process
        # sends its errors to the API workers, remote.py).
        return (_rebuilt, (type(self), self.args), self.__dict__)

    def to_dict(self) -> dict[str, object]:
        body: dict[str, object] = {"code": self.code, "title": self.title, "detail": self.detail}
        if self.field is not None:
            body["field"] = self.field
        return body


class ValidationError(LoadmasterError):
    code = "loadmaster.invalid"
    title = "Invalid input"


class BadQueryValue(ValidationError):
    """A query parameter's value that contradicts itself (a trait required and forbidden)."""

    code = "loadmaster.query.bad_value"


class MissingQueryValue(ValidationError):
    """A request lacks a query parameter it needs."""

    code = "loadmaster.query.missing_value"


class DuplicateQueryKey(ValidationError):
    """A query parameter given more than once where it may be given once."""

    code = "loadmaster.query.duplicate_key"


class UnknownProviderInBody(ValidationError):
    """A request body names a provider that does not exist, where the request itself is
    then wrong (a reshape), not a path to nothing."""

    code = "loadmaster.invalid.unknown_provider"


class NotFound(LoadmasterError):
    code = "loadmaster.not_found"
    title = "Not found"


class Conflict(LoadmasterError):
    """The request is well formed but the current state forbids it (in use, duplicate, ...)."""

    code = "loadmaster.conflict"
    title = "Conflict"


class ConcurrentUpdate(Conflict):
    """A generation compare-and-swap lost against another writer; retrying may succeed."""

    code = "loadmaster.concurrent_update"
    title = "Concurrent update"


class DuplicateName(Conflict):
    code = "loadmaster.duplicate_name"
    title = "Name already used"


class HostHasChildren(Conflict):
    code = "loadmaster.host_has_children"
    title = "Host has child providers"


class HostInUse(Conflict):
    code = "loadmaster.host_in_use"
    title = "Host has allocations"


class InventoryInUse(Conflict):
    """An inventory something is allocated from cannot be removed."""

    code = "loadmaster.inventory_in_use"
    title = "Inventory in use"


class InsufficientCapacity(Conflict):
    code = "loadmaster.insufficient_capacity"
    title = "Insufficient capacity"


class GroupPolicyViolation(Conflict):
    """A claim would break a hard server-group rule; a fresher view may find another host."""

    code = "loadmaster.group_policy"
    title = "Server group policy violated"


class InvalidTransition(Conflict):
    code = "loadmaster.invalid_transition"
    title = "Invalid state transition"


class FenceFailed(Conflict):
    """The fence command did not confirm that a host is off: it is not known down."""

    code = "loadmaster.fence_failed"
    title = "Fencing failed"


class NoValidHost(LoadmasterError):
    code = "loadmaster.no_valid_host"
    title = "No valid host"


class StoreUnavailable(LoadmasterError):
    """The database cannot be reached; nothing was written."""

    code = "loadmaster.store_unavailable"
    title = "Store unavailable"


class SchedulerUnavailable(LoadmasterError):
    """The scheduling process ended during the call (``scheduler/remote.py``)."""

    code = "loadmaster.scheduler_unavailable"
    title = "Scheduler unavailable"


class Busy(LoadmasterError):
    """The server sheds this request to keep the others answered (a fleet of agents
    reading their work lists at once); nothing was done. Try again after
    ``retry_after_s``, which is drawn at random so that those turned away together do
    not come back together."""

    code = "loadmaster.busy"
    title = "Busy"

    def __init__(self, detail: str, *, retry_after_s: int, field: str | None = None) -> None:
        super().__init__(detail, field=field)
        self.retry_after_s = retry_after_s


class PluginFailed(LoadmasterError):
    """A scheduler filter or weigher raised: the server's fault, named so that an operator
    knows which plugin to look at (its traceback is in the server log)."""

    code = "loadmaster.plugin_failed"
    title = "Scheduler plugin failed"


def _rebuilt(kind: type[LoadmasterError], args: tuple[object, ...]) -> LoadmasterError:
    error = kind.__new__(kind)
    error.args = args
    return error
