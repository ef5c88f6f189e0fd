"""`stepq tenant-key`: set, rotate, show and remove a tenant's own provider API key (docs/operate/tenants.md).

The key is read from stdin or from an environment variable, never from the command line (argv shows in `ps`
and shell history); it is stored encrypted with STEPQ_CREDENTIALS_KEY, or as a reference to a secret the
workers hold (`--secret-ref env:NAME` / `file:/path`). Setting a provider's key again rotates it: workers use
the new one from the next step of every running turn of the tenant.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from stepq.config.settings import Settings
from stepq.fleet.runtime import get_runtime
from stepq.producer.cli_policy import _needs_redis, _tenant
from stepq.producer.failures import UsageError
from stepq.store.credentials import CredentialError, reference, seal

PROVIDERS = ("anthropic", "openai", "openai-compatible")  # the adapters that send a tenant's key


def _provider(raw: str) -> str:
    if raw not in PROVIDERS:
        raise UsageError(f"--provider {raw!r} takes no tenant key; one of: {', '.join(PROVIDERS)}")
    return raw


def _read_key(args: argparse.Namespace) -> str:
    if args.from_env:
        value = os.environ.get(args.from_env, "").strip()
        if not value:
            raise UsageError(f"--from-env: ${args.from_env} is not set or empty")
        return value
    if sys.stdin.isatty():
        raise UsageError("pipe the key on stdin (or give --from-env VAR / --secret-ref REF); never on the command line")
    value = sys.stdin.readline().strip()
    if not value:
        raise UsageError("stdin held no key")
    return value


def cmd_tenant_key_set(args: argparse.Namespace, settings: Settings) -> int:
    _needs_redis(settings)
    tenant, provider = _tenant(args.tenant), _provider(args.provider)
    try:
        sealed = (
            reference(provider, args.secret_ref)
            if args.secret_ref
            else seal(provider, _read_key(args), settings.credential_keks)
        )
    except CredentialError as exc:
        raise UsageError(str(exc)) from None
    store = get_runtime(settings).credentials
    replaced = provider in store.get(tenant)
    store.put(tenant, sealed)
    shown = f"secret {sealed.value}" if sealed.kind == "secret" else f"encrypted key …{sealed.fingerprint}"
    print(f"tenant {tenant}: {provider} {'rotated to' if replaced else 'set to'} {shown}")
    print("used from the next step of the tenant's turns (running ones included)")
    return 0


def cmd_tenant_key_show(args: argparse.Namespace, settings: Settings) -> int:
    _needs_redis(settings)
    tenant = _tenant(args.tenant)
    records = get_runtime(settings).credentials.get(tenant)
    if not records:
        print(f"tenant {tenant}: no keys of its own (its turns use the fleet's)")
    for provider, sealed in sorted(records.items()):
        when = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(sealed.updated_at))
        what = f"secret {sealed.value}" if sealed.kind == "secret" else f"encrypted, sha256 …{sealed.fingerprint}"
        print(f"tenant {tenant}: {provider}: {what} (set {when})")
    return 0


def cmd_tenant_key_remove(args: argparse.Namespace, settings: Settings) -> int:
    _needs_redis(settings)
    tenant, provider = _tenant(args.tenant), _provider(args.provider)
    get_runtime(settings).credentials.remove(tenant, provider)
    print(f"tenant {tenant}: {provider} key removed (its turns use the fleet's from their next step)")
    return 0


def add_parser(sub: Any) -> None:
    """`stepq tenant-key set|show|remove`."""
    p = sub.add_parser("tenant-key", help="a tenant's own provider API keys (stored encrypted; rotated live)")
    commands = p.add_subparsers(dest="tenant_key_command", required=True, metavar="ACTION")
    s = commands.add_parser("set", help="set or rotate a provider key (read from stdin or --from-env)")
    s.add_argument("--tenant", required=True)
    s.add_argument("--provider", required=True, help=f"one of {', '.join(PROVIDERS)}")
    source = s.add_mutually_exclusive_group()
    source.add_argument("--from-env", metavar="VAR", help="read the key from this environment variable")
    source.add_argument("--secret-ref", metavar="REF", help="store no key: env:NAME or file:/path on the workers")
    s.set_defaults(func=cmd_tenant_key_set)
    show = commands.add_parser("show", help="which providers a tenant has keys for (fingerprints, never keys)")
    show.add_argument("--tenant", required=True)
    show.set_defaults(func=cmd_tenant_key_show)
    r = commands.add_parser("remove", help="remove a provider key (the tenant's turns use the fleet's)")
    r.add_argument("--tenant", required=True)
    r.add_argument("--provider", required=True)
    r.set_defaults(func=cmd_tenant_key_remove)


COMMANDS = (cmd_tenant_key_set, cmd_tenant_key_show, cmd_tenant_key_remove)
