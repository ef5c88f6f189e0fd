"""`stepq demo`: embedded (no services), and against real Redis with a separately running worker."""

from __future__ import annotations

import os
import subprocess

from tests.conftest import ROOT, settings_env
from tests.test_cli import stepq_cmd


def run_demo(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*stepq_cmd(), "demo"],
        env=env,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_tour(out: str) -> None:
    # part 1: streamed text, the read tool, the signed approval, the resumed loop
    assert "Let me look that order up." in out
    assert "→ lookup_order" in out and "← lookup_order" in out
    assert "approval id  apv_" in out
    assert "signed (HMAC-SHA256" in out
    assert "✓ approved by demo" in out
    assert '"refund_id": "R-' in out
    assert "Done: the refund is on its way." in out
    # part 2: object mode, the failed validation, the repair, the parsed object
    assert "does not match the Contact schema: email: Field required" in out
    assert "repair step" in out
    assert '"email": "ada@engines.example"' in out
    assert "TurnResult.object" in out
    # part 3: a prompt-aware offline model: each input gives its own object
    assert '"company": "Juniper Tiles", "city": "Porto", "employees": 42' in out
    assert '"company": "Okra Logistics", "city": "Ghent", "employees": 1800' in out
    assert out.count("completed · finish: stop") == 2
    assert "What next" in out


def test_demo_embedded():
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPQ_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = run_demo(env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_tour(proc.stdout)
    assert "Running embedded" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_demo_against_real_redis(worker, settings):
    proc = run_demo(settings_env(settings))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_tour(proc.stdout)
    assert f"key prefix {settings.key_prefix!r}" in proc.stdout
