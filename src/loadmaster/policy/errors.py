"""The one error the policy engine raises, always pointing at a place in a policy file."""

from __future__ import annotations

from loadmaster.errors import LoadmasterError


class PolicyError(LoadmasterError):
    """A syntax or evaluation error at ``file:line:column`` (1-based; 0 when no position applies).

    Unlike MOM, every failure of a policy is this exception, never a bare ``KeyError`` or
    ``TypeError``, so a caller needs exactly one ``except`` to keep a cycle all-or-nothing.
    """

    code = "loadmaster.policy_error"
    title = "Policy error"
    status = 400

    def __init__(self, file: str, line: int, column: int, message: str) -> None:
        self.file = file
        self.line = line
        self.column = column
        self.message = message
        # The guest entity being evaluated when this was raised (the innermost iteration
        # of ``with Guests``), set by the evaluator: lets a cycle leave out the guest whose
        # incomplete sample made the policy fail.
        self.subject: object | None = None
        where = f"{file}:{line}:{column}" if line > 0 else file
        super().__init__(f"{where}: {message}")

    def __reduce__(self) -> tuple[type[PolicyError], tuple[str, int, int, str]]:
        return (type(self), (self.file, self.line, self.column, self.message))


class PolicyLimitError(PolicyError):
    """A cycle stopped because the policy exceeded a bound: steps, memory or wall time.

    Raised where evaluation stood when the bound was hit. Unlike other evaluation errors,
    which MOM also has, this one says the policy *text* is unfit to run, so the agent
    falls back to the previous version of the file named here.
    """

    code = "loadmaster.policy_limit"
    title = "Policy exceeded a bound"
