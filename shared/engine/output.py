"""Object mode: parse and validate the final answer against the agent's output schema."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
from pydantic import BaseModel, ValidationError

from stepq.agents.definition import AgentDefinition
from stepq.errors import InvalidOutputError

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def parse_object(agent: AgentDefinition, text: str) -> Any:
    """Return the validated object (JSON-ready) or raise InvalidOutputError naming what is wrong."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        raise InvalidOutputError(f"the answer is not valid JSON ({exc.msg} at position {exc.pos})") from None
    schema = agent.output
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        try:
            return schema.model_validate(value).model_dump(mode="json")
        except ValidationError as exc:
            problems = [f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors()]
            raise InvalidOutputError("; ".join(problems)) from None
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if errors:
        raise InvalidOutputError(
            "; ".join(f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors)
        )
    return value


def repair_note(agent: AgentDefinition, problems: str) -> str:
    schema = json.dumps(agent.output_schema(), separators=(",", ":"))
    return (
        "Your answer did not match the required JSON schema. Problems: "
        f"{problems}. Reply with only the corrected JSON object, matching this schema: {schema}"
    )
