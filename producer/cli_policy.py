"""`stepq policy`: set, show and clear tenant policies (the tenant layer of the resolution chain, stepq.policy.resolution).

A change is one atomic write in Redis; workers pick it up at the next step of every running turn of that
tenant, with no restart.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from pydantic import ValidationError

from stepq.config.settings import Settings
from stepq.fleet.runtime import get_runtime
from stepq.models import Policy, UnknownPresetError, budget_preset
from stepq.policy.resolution import SCOPE_ALL, check_scope
from stepq.producer.failures import UsageError

_FIELDS = list(Policy.model_fields)


def _csv(raw: str) -> list[str]:
    return [part.strip() for part in raw.split(",") if part.strip()]


def _bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("true", "yes", "on", "1"):
        return True
    if lowered in ("false", "no", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"{raw!r} is not true or false")


def _needs_redis(settings: Settings) -> None:
    if settings.embedded:
        raise UsageError("`stepq policy` needs a shared Redis (set STEPQ_REDIS_URL): workers read policies from it")


def _scope(raw: str) -> str:
    try:
        return check_scope(raw)
    except ValueError as exc:
        raise UsageError(f"--scope: {exc}") from None


def _tenant(raw: str) -> str:
    if not raw.strip() or len(raw) > 200:
        raise UsageError("--tenant must be a tenant name of 1 to 200 characters")
    return raw


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    """The fields the command line sets (None: not given)."""
    given: dict[str, Any] = {name: getattr(args, name, None) for name in _FIELDS}
    quota = {
        k: v
        for k, v in (("tokens", args.quota_tokens), ("cost", args.quota_cost), ("window_s", args.quota_window_s))
        if v is not None
    }
    given["quota"] = quota or None
    for name in ("allowed_tools", "models"):
        if given[name] is not None:
            given[name] = _csv(given[name])
    if given["stop_when"] is not None:
        given["stop_when"] = _stop_when(given["stop_when"])
    if given["prompt_sections"] is not None:
        given["prompt_sections"] = _sections(given["prompt_sections"])
    return {name: value for name, value in given.items() if value is not None}


def _stop_when(raw: str) -> list[Any]:
    """`--stop-when` is JSON: one condition or a list (`[{"step_count": 3}, {"has_tool_call": "hand_over"}]`)."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        raise UsageError(
            '--stop-when must be JSON such as \'[{"step_count": 3}]\' or \'{"has_tool_call": "hand_over"}\''
        ) from None
    return value if isinstance(value, list) else [value]


def _sections(pairs: list[str]) -> dict[str, str]:
    """`--prompt-section NAME=TEXT` (repeatable) as {name: text}."""
    sections: dict[str, str] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--prompt-section {pair!r} must be NAME=TEXT (a section the agent declares)")
        sections[name.strip()] = text
    return sections


def _check_preset(settings: Settings, changes: dict[str, Any]) -> None:
    """A preset this process does not define is refused here, not first at a worker's step."""
    name = changes.get("budget")
    if name is not None:
        try:
            budget_preset(name, settings.budget_presets)
        except UnknownPresetError as exc:
            raise UsageError(f"--budget: {exc}") from None


def _unset(names: list[str]) -> list[str]:
    fields = [n.replace("-", "_") for n in names]
    unknown = [n for n in fields if n not in _FIELDS]
    if unknown:
        raise UsageError(f"--unset: unknown field {unknown[0]!r}; fields: {', '.join(_FIELDS)}")
    return fields


def _option(loc: tuple[int | str, ...]) -> str:
    """The flag that set the field a validation error is about: a quota's own fields have flags of their own."""
    path = [str(part) for part in loc if isinstance(part, str)]  # an index into a list names no flag
    if path == ["quota"]:  # the quota as a whole: it needs one of its limits
        return "--quota-tokens/--quota-cost"
    return "--" + "-".join(path).replace("_", "-") if path else "policy"


def cmd_policy_set(args: argparse.Namespace, settings: Settings) -> int:
    _needs_redis(settings)
    tenant, scope = _tenant(args.tenant), _scope(args.scope)
    changes, unset = _changes(args), _unset(args.unset)
    if not changes and not unset:
        raise UsageError("nothing to set: give at least one field (e.g. --max-steps 3) or --unset FIELD")
    _check_preset(settings, changes)
    try:
        policy = get_runtime(settings).policies.update(tenant, scope, changes, unset)
    except ValidationError as exc:
        first = exc.errors()[0]
        option = _option(first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise UsageError(f"{option}: {message[:1].lower() + message[1:]}") from None
    shown = describe(policy) if policy is not None else "(nothing left: removed)"
    print(f"tenant {tenant} ({scope}): {shown}")
    print("applies to new submits now, and to running turns of the tenant from their next step")
    return 0


def cmd_policy_show(args: argparse.Namespace, settings: Settings) -> int:
    _needs_redis(settings)
    store = get_runtime(settings).policies
    tenants = [_tenant(args.tenant)] if args.tenant else store.tenants()
    docs = {tenant: store.get(tenant) for tenant in tenants}
    if args.json:
        dump = lambda doc: {scope: p.model_dump(exclude_none=True) for scope, p in doc.items()}  # noqa: E731
        print(json.dumps({"environment": dump(settings.policy), "tenants": {t: dump(d) for t, d in docs.items()}}))
        return 0
    print("environment (STEPQ_POLICY of this process; each worker applies its own):")
    _print_doc(settings.policy)
    for tenant, doc in docs.items():
        print(f"tenant {tenant}:")
        _print_doc(doc)
    if not docs:
        print("no tenant policies (set one with `stepq policy set --tenant T --max-steps N`)")
    return 0


def cmd_policy_clear(args: argparse.Namespace, settings: Settings) -> int:
    _needs_redis(settings)
    tenant = _tenant(args.tenant)
    scope = _scope(args.scope) if args.scope else None
    get_runtime(settings).policies.clear(tenant, scope)
    print(f"tenant {tenant}: {'policy removed' if scope is None else f'scope {scope} removed'}")
    return 0


def describe(policy: Policy) -> str:
    fields = policy.model_dump(exclude_none=True)
    return ", ".join(f"{k}={_shown(v)}" for k, v in fields.items()) or "(empty)"


def _shown(value: Any) -> str:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    return json.dumps(value, separators=(",", ":")) if isinstance(value, list | dict) else str(value)


def _print_doc(doc: dict[str, Policy]) -> None:
    if not doc:
        print("  (none)")
    for scope, policy in doc.items():
        print(f"  {scope}: {describe(policy)}")


def add_parser(sub: Any) -> None:
    """`stepq policy set|show|clear`."""
    p = sub.add_parser("policy", help="tenant policies: limits, allowlists, kill switch (see `stepq policy --help`)")
    commands = p.add_subparsers(dest="policy_command", required=True, metavar="ACTION")

    s = commands.add_parser("set", help="tighten what a tenant's turns may do (merged into its policy)")
    s.add_argument("--tenant", required=True, help="the tenant (a turn's metadata.tenant; the gateway sets it)")
    s.add_argument("--scope", default=SCOPE_ALL, help="an agent id, a module, or * for every agent (default)")
    s.add_argument("--max-steps", dest="max_steps", type=int, help="most model calls in a turn")
    s.add_argument("--max-tool-calls", dest="max_tool_calls", type=int, help="most tool calls in a turn")
    s.add_argument("--max-tokens", dest="max_tokens", type=int, help="most input+output tokens in a turn")
    s.add_argument("--max-wall-clock-s", dest="max_wall_clock_s", type=float, help="seconds since the first step")
    s.add_argument(
        "--max-output-tokens", dest="max_output_tokens", type=int, help="cap on one model call's output tokens"
    )
    s.add_argument("--allowed-tools", dest="allowed_tools", metavar="A,B", help="tools agents may still show")
    s.add_argument(
        "--mutation-policy",
        dest="mutation_policy",
        choices=["confirm-required", "destructive-confirm-required", "read-only"],
        help="downgrade only (confirm-required < destructive-confirm-required < read-only)",
    )
    s.add_argument("--models", metavar="P/M,...", help="allowed provider/model patterns (anthropic/*, bedrock, *)")
    s.add_argument(
        "--allow-runtime-override",
        dest="allow_runtime_override",
        type=_bool,
        metavar="BOOL",
        help="false refuses per-call provider/model choice and loop overrides",
    )
    s.add_argument(
        "--kill-switch",
        dest="kill_switch",
        choices=["off", "collapse", "refuse"],
        help="collapse: one model call with no tools; refuse: no new submits or steps",
    )
    s.add_argument(
        "--stop-when",
        dest="stop_when",
        metavar="JSON",
        help="extra stop conditions, e.g. '[{\"step_count\": 3}]' (they only end turns sooner)",
    )
    s.add_argument(
        "--tool-choice",
        dest="tool_choice",
        metavar="CHOICE",
        help="tighten every step's tool choice: auto < required < a tool's name; auto < none",
    )
    s.add_argument(
        "--prompt-section",
        dest="prompt_sections",
        action="append",
        metavar="NAME=TEXT",
        help="set the text of a prompt section the agent declares (repeatable)",
    )
    s.add_argument(
        "--default-model",
        dest="default_model",
        metavar="PROVIDER/MODEL",
        help="the model the tenant's turns run on when the request names none (within the agent's allowed models)",
    )
    s.add_argument("--quota-tokens", dest="quota_tokens", type=int, help="most tokens per quota window")
    s.add_argument("--quota-cost", dest="quota_cost", type=float, help="most cost per quota window (STEPQ_PRICES)")
    s.add_argument(
        "--quota-window-s", dest="quota_window_s", type=float, help="the quota's window in seconds (default 86400)"
    )
    s.add_argument("--budget", metavar="PRESET", help="a budget preset (small, standard, long, STEPQ_BUDGET_PRESETS)")
    s.add_argument("--unset", action="append", default=[], metavar="FIELD", help="remove a field (repeatable)")
    s.set_defaults(func=cmd_policy_set)

    show = commands.add_parser("show", help="the environment's and every tenant's policies")
    show.add_argument("--tenant", help="only this tenant")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_policy_show)

    c = commands.add_parser("clear", help="remove a tenant's policy (or one scope of it)")
    c.add_argument("--tenant", required=True)
    c.add_argument("--scope", help="only this scope")
    c.set_defaults(func=cmd_policy_clear)


COMMANDS = (cmd_policy_set, cmd_policy_show, cmd_policy_clear)  # one-shot: they reach Redis first
