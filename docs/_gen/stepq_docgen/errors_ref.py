"""The error reference: `stepq.errors`' class tree with each class's docstring, and what each becomes at the
two edges that translate it, found by asking them: the CLI's exit code (`stepq.producer.failures.describe`)
and the gateway's HTTP status and `error.code` (`stepq.producer.gateway.errors.from_stepq`)."""

from __future__ import annotations

import ast
import inspect
import logging
import textwrap
from enum import StrEnum
from typing import Any

import stepq
from stepq import errors
from stepq.producer.failures import describe
from stepq.producer.gateway import errors as gateway_errors
from stepq_docgen import escape_text

# keyword arguments some error classes require (the value does not change how the edges map the class)
_SAMPLE_ARGS: dict[str, Any] = {
    "resets_at": 0.0,
    "retry_after_s": 1.0,
    "entries": [],
    "running_turn_id": "turn",
    "retryable": False,
    "feature": "a feature",
    "extra": "gateway",
}


def classes() -> list[type[errors.StepqError]]:
    """Every error class of `stepq.errors`, in the order the module defines them."""
    found = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, errors.StepqError)]
    return sorted(found, key=lambda c: inspect.getsourcelines(c)[1])


def _samples(cls: type[errors.StepqError]) -> list[errors.StepqError]:
    """Instances to ask the edges about: one per refusal code for errors that carry a code."""
    if not any("__init__" in vars(klass) for klass in cls.__mro__[: cls.__mro__.index(errors.StepqError) + 1]):
        return [cls("message")]  # Exception's own constructor
    params = inspect.signature(cls.__init__).parameters
    refusals = {errors.ApprovalError: errors.ApprovalRefusal, errors.ToolResultsError: errors.ToolResultsRefusal}
    for error, refusal in refusals.items():
        if issubclass(cls, error):
            return [cls(code, "message") for code in refusal]
    kwargs = {name: _SAMPLE_ARGS[name] for name in params if name in _SAMPLE_ARGS}
    if "message" in params:
        return [cls("message", **kwargs)]
    return [cls(**kwargs)]


def _gateway(sample: errors.StepqError) -> str:
    quiet = logging.getLogger("stepq.gateway")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # from_stepq logs an unreachable Redis; nothing is unreachable here
    try:
        answer = gateway_errors.from_stepq(sample)
    finally:
        quiet.setLevel(level)
    return f"{answer.status} `{answer.code}`"


def _summary(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    return escape_text(" ".join(doc.split("\n\n")[0].split()).replace("|", "\\|"))


def _bases(cls: type) -> str:
    return ", ".join(f"`{b.__name__}`" for b in cls.__bases__)


def _member_comments(enum: type[StrEnum]) -> dict[str, str]:
    """Each member's trailing comment in the source: the codes' meanings live there."""
    lines, _ = inspect.getsourcelines(enum)
    comments: dict[str, str] = {}
    for node in ast.parse(textwrap.dedent("".join(lines))).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            line = lines[node.lineno - 1]
            comments[node.targets[0].id] = line.split("#", 1)[1].strip() if "#" in line else ""
    return comments


def _refusals(enum: type[StrEnum], error: type[errors.StepqError]) -> list[str]:
    comments = _member_comments(enum)
    out = [f"### `{enum.__name__}`", "", _summary(enum), ""]
    out += ["| Code | Member | Meaning | HTTP |", "|---|---|---|---|"]
    for member in enum:
        sample = error(member, "message")
        out.append(f"| `{member.value}` | `{member.name}` | {comments.get(member.name, '')} | {_gateway(sample)} |")
    return [*out, ""]


def render() -> str:
    out = ["## Error classes", ""]
    out += ["| Class | Bases | Public | CLI exit code | Gateway answer | Meaning |", "|---|---|---|---|---|---|"]
    for cls in classes():
        samples = _samples(cls)
        failure = describe(samples[0], None)
        exit_code = str(failure.code) if failure else "1"
        answers = ", ".join(dict.fromkeys(_gateway(s) for s in samples))
        public = "yes" if cls.__name__ in stepq.__all__ else "no"
        row = f"| `{cls.__name__}` | {_bases(cls)} | {public} | {exit_code} | {answers} | {_summary(cls)} |"
        out.append(row)
    out += ["", "## Refusal codes", ""]
    out += _refusals(errors.ApprovalRefusal, errors.ApprovalError)
    out += _refusals(errors.ToolResultsRefusal, errors.ToolResultsError)
    out += ["## The gateway's error codes by HTTP status", ""]
    out += [
        "Any other HTTP error of the framework (an unknown route, a wrong method) answers with the code of its status:",
        "",
    ]
    out += ["| Status | `error.code` |", "|---|---|"]
    out += [f"| {status} | `{code}` |" for status, code in sorted(gateway_errors._HTTP_CODES.items())]
    return "\n".join([*out, ""])
