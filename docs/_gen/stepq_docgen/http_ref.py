"""The gateway's HTTP API from its OpenAPI document: the app built as `stepq serve` builds it (create_app with
the settings and auth it uses), then `app.openapi()` rendered as Markdown, with no Swagger UI from a CDN."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute

from stepq.config.settings import Settings
from stepq.producer.gateway.app import create_app
from stepq.producer.gateway.auth import AuthConfig
from stepq.producer.gateway.serve import DEMO_AGENTS
from stepq_docgen import escape_text

METHODS = ("get", "post", "put", "patch", "delete")
# the app is only built, never started: nothing connects to this address
UNUSED_REDIS = "redis://127.0.0.1:1/0"
REQUIRE = "require.<locals>.dependency"  # stepq.producer.gateway.auth.require's dependency: it names the scopes


def app() -> FastAPI:
    """The app `stepq serve` runs (the same routers, whatever the credentials)."""
    settings = Settings(redis_url=UNUSED_REDIS, agent_modules=[DEMO_AGENTS])
    return create_app(settings, AuthConfig.from_settings(settings, insecure_dev=True))


def _routes(routes: list[Any]) -> Iterator[APIRoute]:
    """Every APIRoute, inside included routers too."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        included = getattr(route, "original_router", None) or getattr(route, "router", None)
        if included is not None and hasattr(included, "routes"):
            yield from _routes(included.routes)


def _accepted(dependant: Any) -> list[tuple[str, ...]]:
    """The scopes each `auth.require(...)` dependency of a route accepts (any one of a tuple will do)."""
    found = []
    for dependency in dependant.dependencies:
        if getattr(dependency.call, "__qualname__", "") == REQUIRE:
            found.append(tuple(inspect.getclosurevars(dependency.call).nonlocals["accepted"]))
        found += _accepted(dependency)
    return found


def scopes(application: FastAPI) -> dict[tuple[str, str], list[tuple[str, ...]]]:
    """(METHOD, path) -> the scopes its credential needs; an empty list: no credential needed."""
    return {
        (method, route.path): _accepted(route.dependant)
        for route in _routes(application.routes)
        for method in route.methods or ()
    }


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type(schema: dict[str, Any]) -> str:
    """A schema in a few words: `string`, `integer or null`, [`SubmitBody`](#submitbody), `array of string`."""
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        return f"[`{name}`](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(dict.fromkeys(_type(option) for option in schema["anyOf"]))
    if "enum" in schema:
        return " \\| ".join(f"`{value}`" for value in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema and isinstance(schema["additionalProperties"], dict):
        return f"object of {_type(schema['additionalProperties'])}"
    return f"`{kind}`"


def _cell(text: str) -> str:
    return escape_text(" ".join(str(text).split()).replace("|", "\\|"))


def _credential(needed: list[tuple[str, ...]]) -> str:
    if not needed:
        return "**Credential:** none."
    return "**Credential:** " + "; ".join(" or ".join(f"scope `{s}`" for s in accepted) for accepted in needed) + "."


def _operation(path: str, method: str, op: dict[str, Any], needed: list[tuple[str, ...]]) -> list[str]:
    out = [f"### `{method.upper()} {path}`", ""]
    if op.get("summary"):
        out += [f"**{op['summary']}.**" + (f" {_cell(op['description'])}" if op.get("description") else ""), ""]
    out += [_credential(needed), ""]
    params = op.get("parameters", [])
    if params:
        out += ["| Parameter | In | Required | Type | Description |", "|---|---|---|---|---|"]
        for p in params:
            description = p.get("description") or p.get("schema", {}).get("description", "")
            required = "yes" if p.get("required") else "no"
            schema_type = _type(p.get("schema", {}))
            out.append(f"| `{p['name']}` | {p['in']} | {required} | {schema_type} | {_cell(description)} |")
        out.append("")
    body = op.get("requestBody")
    if body:
        kinds = ", ".join(f"`{media}` {_type(content.get('schema', {}))}" for media, content in body["content"].items())
        out += [f"Request body{' (required)' if body.get('required') else ''}: {kinds}.", ""]
    out += ["| Status | Meaning | Body |", "|---|---|---|"]
    for status, response in sorted(op.get("responses", {}).items()):
        content = response.get("content", {})
        shown = ", ".join(f"`{media}` {_type(c.get('schema', {}))}" for media, c in content.items()) or " "
        out.append(f"| {status} | {_cell(response.get('description', ''))} | {shown} |")
    out.append("")
    return out


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    out = [f"### `{name}`", ""]
    if schema.get("description"):
        out += [_cell(schema["description"]), ""]
    properties = schema.get("properties", {})
    if "enum" in schema:
        out += ["One of " + ", ".join(f"`{value}`" for value in schema["enum"]) + ".", ""]
    if properties:
        required = set(schema.get("required", []))
        out += ["| Field | Type | Required | Description |", "|---|---|---|---|"]
        for field, prop in properties.items():
            flag = "yes" if field in required else "no"
            out.append(f"| `{field}` | {_type(prop)} | {flag} | {_cell(prop.get('description', ''))} |")
        out.append("")
    return out


def render() -> str:
    application = app()
    document = application.openapi()
    needs = scopes(application)
    info = document["info"]
    out = [f"{info.get('description', '')} (OpenAPI {document['openapi']}, API version {info['version']}.)", ""]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, operations in document["paths"].items():
        for method in METHODS:
            if method in operations:
                op = operations[method]
                by_tag.setdefault((op.get("tags") or ["other"])[0], []).append((path, method, op))
    for tag, operations in by_tag.items():
        out += [f"## {tag[:1].upper() + tag[1:]}", ""]
        for path, method, op in operations:
            if (method.upper(), path) not in needs:  # the walk over the routers missed it: say so, never guess
                raise LookupError(f"{method.upper()} {path} of the OpenAPI document is not among the app's routes")
            out += _operation(path, method, op, needs[method.upper(), path])
    out += ["## Schemas", ""]
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        out += _schema(name, schema)
    return "\n".join(out)
