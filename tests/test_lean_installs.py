"""Lean installs: a feature whose extra is not installed fails at start, in one line naming the extra.

Each test runs a fresh interpreter in which the extra's SDK cannot be imported: a `sitecustomize`
on PYTHONPATH puts None in `sys.modules` for it, which is exactly what Python reports for a
package that is not installed (an ImportError naming the module).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import redis

from tests.conftest import REDIS_URL, ROOT

TIMEOUT = 120
CHECKOUT = f"(in {ROOT})"  # these tests run stepq from this source checkout: its own install command


def from_checkout(extra: str) -> str:
    return f"pip install -e '.[{extra}]' {CHECKOUT}"


AGENT_MODULE = '''
from stepq import AgentDefinition, tool


@tool
def lean_lookup(key: str) -> str:
    """Look a key up."""
    return key


researcher = AgentDefinition(
    id="lean_agents.researcher",
    allowed_tools=["lean_lookup"],
    default_provider="{provider}",
    default_model="some-model",
)
'''


def blocked_env(tmp_path: Path, blocked: list[str], provider: str = "gemini") -> dict[str, str]:
    """An environment whose interpreters cannot import `blocked`, with an agent module on the path."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in blocked)
    )
    (tmp_path / "lean_agents.py").write_text(AGENT_MODULE.format(provider=provider))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPQ_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    return env


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL
    )


def stepq_cmd() -> list[str]:
    script = Path(sys.executable).with_name("stepq")
    return [str(script)] if script.exists() else [sys.executable, "-m", "stepq.producer.cli"]


@pytest.mark.parametrize(
    ("provider", "blocked", "extra"),
    [
        ("gemini", ["google"], "gemini"),
        ("anthropic", ["anthropic"], "anthropic"),
        ("bedrock", ["boto3"], "bedrock"),
        ("openai", ["openai"], "openai"),
        ("openai-compatible", ["openai"], "openai"),
        ("azure-openai", ["openai"], "openai"),
    ],
)
def test_provider_without_its_extra_fails_at_agent_load(tmp_path: Path, provider: str, blocked: list[str], extra: str):
    env = blocked_env(tmp_path, blocked, provider)
    script = textwrap.dedent(
        """
        from stepq import MissingExtraError
        from stepq.agents.registry import registry
        try:
            registry().load_modules(["lean_agents"])
        except MissingExtraError as exc:
            print(f"{type(exc).__name__}|{exc.extra}|{exc}")
        else:
            print("loaded")
        """
    )
    proc = run(env, sys.executable, "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        f"MissingExtraError|{extra}|provider '{provider}' needs the {extra} extra: {from_checkout(extra)}"
    )


def test_cli_names_the_missing_provider_extra_in_one_line(tmp_path: Path):
    env = blocked_env(tmp_path, ["google"])
    env["STEPQ_AGENT_MODULES"] = "lean_agents"
    proc = run(env, *stepq_cmd(), "run", "lean_agents.researcher", "hello")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepq: "), proc.stderr
    assert lines[0].endswith(f"provider 'gemini' needs the gemini extra: {from_checkout('gemini')}")


def test_embedded_mode_without_fakeredis_names_the_embedded_extra(tmp_path: Path):
    env = blocked_env(tmp_path, ["fakeredis"])
    proc = run(env, *stepq_cmd(), "run", "demo.support", "hello", "--deny-all")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepq: "), proc.stderr
    assert lines[0].endswith(
        f"embedded mode (STEPQ_REDIS_URL unset) needs the embedded extra: {from_checkout('embedded')}"
    )


@pytest.mark.parametrize(
    ("argv", "blocked", "feature"),
    [
        (["serve", "--insecure-dev"], ["jwt"], "stepq serve"),  # what `make demo` (embedded only) leaves out
        (["serve", "--insecure-dev"], ["uvicorn"], "stepq serve"),
        (["demo", "--serve"], ["fastapi"], "stepq demo --serve"),
        (["worker", "--pool", "gevent", "--no-beat"], ["gevent"], "`stepq worker --pool gevent`"),
    ],
)
def test_a_command_without_its_extra_names_it_in_one_line(
    tmp_path: Path, argv: list[str], blocked: list[str], feature: str
):
    env = blocked_env(tmp_path, blocked)
    if argv[0] == "worker":
        env["STEPQ_REDIS_URL"] = REDIS_URL  # a worker needs a Redis before it needs its pool
    proc = run(env, *stepq_cmd(), *argv)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    extra = "gevent" if argv[0] == "worker" else "gateway"
    assert lines[0] == f"stepq: error: {feature} needs the {extra} extra: {from_checkout(extra)}", proc.stderr


def test_an_extra_module_missing_anywhere_is_still_one_line_naming_the_extra():
    """The last line of defence in every command's handler: an extra's module missing before any check of its own."""
    from stepq.producer.failures import describe

    failure = describe(ModuleNotFoundError("No module named 'google'", name="google.genai"), None)
    assert failure is not None and failure.code == 2
    assert failure.message == f"this command needs the gemini extra (no module google.genai): {from_checkout('gemini')}"
    assert describe(ModuleNotFoundError("No module named 'mypkg'", name="mypkg"), None) is None  # not an extra: a bug


def test_an_installed_package_names_the_published_extra(tmp_path: Path):
    """Outside a checkout (a wheel in site-packages) the command installs the extra of the published package."""
    site = tmp_path / "site" / "stepq"
    site.mkdir(parents=True)
    (site / "errors.py").write_text((ROOT / "shared" / "errors.py").read_text())
    script = "import importlib.util as u, sys; p = sys.argv[1]; s = u.spec_from_file_location('e', p); "
    script += "m = u.module_from_spec(s); s.loader.exec_module(m); print(m.MissingExtraError('stepq serve', 'gateway'))"
    proc = run({**os.environ, "PYTHONPATH": ""}, sys.executable, "-c", script, str(site / "errors.py"))
    assert proc.stdout.strip() == "stepq serve needs the gateway extra: pip install 'stepq[gateway]'", proc.stderr


def test_blocked_sdk_is_really_unimportable(tmp_path: Path):
    """The blocker does what the tests above assume: the SDK cannot be imported at all."""
    env = blocked_env(tmp_path, ["google"])
    proc = run(env, sys.executable, "-c", "import google.genai")
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr


@pytest.mark.parametrize("provider", ["anthropic", "anthropic-vertex", "gemini", "bedrock", "openai", "azure-openai"])
def test_loading_agents_checks_their_tools_without_importing_the_sdk(tmp_path: Path, provider: str):
    """Agent load (every CLI command, every worker start) checks tool schemas and that the SDK is installed,
    but importing an SDK costs seconds: it happens at the first model call, not here."""
    env = blocked_env(tmp_path, [], provider)
    script = textwrap.dedent(
        """
        import sys
        from stepq.agents.registry import registry
        registry().load_modules(["lean_agents"])
        sdks = ("anthropic", "openai", "google.genai", "boto3", "botocore")
        print(sorted(name for name in sys.modules if name in sdks))
        """
    )
    proc = run(env, sys.executable, "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_a_worker_imports_its_agents_sdks_at_start_not_in_its_first_step(tmp_path: Path):
    """The other side of the test above: a worker pays the SDK imports once, when it starts, so its first
    steps do not spend seconds importing inside their lease and their provider timeouts."""
    env = blocked_env(tmp_path, [], "anthropic")
    env["STEPQ_REDIS_URL"] = REDIS_URL
    env["STEPQ_KEY_PREFIX"] = env["STEPQ_QUEUE"] = f"aqt-lean-{uuid.uuid4().hex[:8]}"
    env["STEPQ_AGENT_MODULES"] = "lean_agents"
    script = textwrap.dedent(
        """
        import sys
        from celery.contrib.testing.worker import start_worker
        from stepq.workers.app import create_app
        from stepq.fleet.protocol import worker_queues
        from stepq.config.settings import get_settings

        app = create_app()
        before = "anthropic" in sys.modules
        with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False,
                          queues=worker_queues(get_settings())):
            print(before, "anthropic" in sys.modules, "openai" in sys.modules)
        """
    )
    try:
        proc = run(env, sys.executable, "-c", script)
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(match=f"*{env['STEPQ_KEY_PREFIX']}*"):  # its queues' kombu bindings too
            client.delete(key)
        client.close()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False True False"  # only what its agents name


TURN_IN_EMBEDDED_MODE = """
import sys
from stepq import Client
result = Client().submit("demo.support", prompt="hello").wait(timeout=60)
loaded = [name for name, module in sys.modules.items() if module is not None and name.startswith("opentelemetry")]
print(result.status.value, bool(loaded))
"""


def test_without_the_otel_extra_turns_run_and_tracing_stays_off(tmp_path: Path):
    env = blocked_env(tmp_path, ["opentelemetry"])
    proc = run(env, sys.executable, "-c", TURN_IN_EMBEDDED_MODE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["completed", "False"] and "opentelemetry" not in proc.stderr

    env["OTEL_TRACES_EXPORTER"] = "otlp"  # asked for, but the extra is missing: one warning, the turn still runs
    proc = run(env, sys.executable, "-c", TURN_IN_EMBEDDED_MODE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["completed", "False"]
    [warning] = [line for line in proc.stderr.splitlines() if "stepq[otel]" in line]
    assert "OTEL_TRACES_EXPORTER asks for traces, but stepq[otel] is not installed" in warning
