"""The AI SDK's own client (npm `ai`, pinned in tests/node/package-lock.json) against a running gateway:
`node --test tests/node` drives POST /v1/chat and GET /v1/chat/{id}/stream and checks the UIMessages it
rebuilds (text, tools, approvals, resume, step resets). See tests/node/chat.test.mjs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.chat_support import API_KEY, chat_stack
from tests.conftest import ROOT

NODE_DIR = ROOT / "tests" / "node"


def node_ready() -> str:
    """The node binary, with the locked `ai` package installed (`npm ci` when it is missing)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("Node.js (node and npm) is not installed: the AI SDK conformance test needs Node 20+")
    if not (NODE_DIR / "node_modules" / "ai" / "package.json").exists():
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, capture_output=True, text=True)
        assert done.returncode == 0, f"npm ci failed in {NODE_DIR}:\n{done.stdout}\n{done.stderr}"
    return node


def test_ai_sdk_client_conformance(prefix: str) -> None:
    node = node_ready()
    with chat_stack(prefix) as stack:
        env = {
            **os.environ,
            "STEPQ_GATEWAY_URL": stack.url,
            "STEPQ_API_KEY": API_KEY,
            "STEPQ_CONTROL_URL": stack.control_url,
        }
        done = subprocess.run(
            [node, "--test", "--test-reporter=tap", "chat.test.mjs"],
            cwd=NODE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    assert done.returncode == 0, f"node --test failed:\n{done.stdout}\n{done.stderr}"
    summary = dict(re.findall(r"^# (tests|pass|fail|skipped) (\d+)$", done.stdout, re.MULTILINE))
    assert int(summary["tests"]) >= 8 and summary["pass"] == summary["tests"], done.stdout
