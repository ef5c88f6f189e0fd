"""Errors a caller can act on. Messages name the problem and never carry secrets."""

from __future__ import annotations


class StepqError(Exception):
    """Base of every error stepq raises on purpose."""


class DefinitionError(StepqError):
    """An agent or tool definition is invalid; raised at load time, not at call time."""


class SubmitError(StepqError, ValueError):
    """A submit request was refused; nothing was stored."""


class UnknownAgentError(SubmitError):
    pass


class MissingFeaturesError(SubmitError):
    pass


class OverrideError(SubmitError):
    """A caller override tried to widen what the agent definition allows."""


class TurnNotFoundError(StepqError, LookupError):
    pass


class ApprovalError(StepqError):
    """An approval decision was refused (unknown id, bad token, not pending, expired, changed args)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
