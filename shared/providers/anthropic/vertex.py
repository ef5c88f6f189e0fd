"""The `anthropic-vertex` provider: Claude on Vertex AI through the SDK's `AnthropicVertex` client.

Same Messages wire and streaming as `anthropic` (one adapter), reached at
`…/publishers/anthropic/models/<model>:streamRawPredict`. The SDK reads `CLOUD_ML_REGION`,
`ANTHROPIC_VERTEX_PROJECT_ID` and `ANTHROPIC_VERTEX_BASE_URL`; the token comes from Google
Application Default Credentials. As in the plan, Vertex+Claude turns the tool-failure
breaker on (2 strikes).
"""

from __future__ import annotations

import hashlib
import os
import threading

from anthropic import AnthropicVertex

from stepq.errors import SubmitError
from stepq.models import ToolSpec
from stepq.providers.anthropic.adapter import AnthropicAdapter, sdk_spans_off
from stepq.providers.anthropic.stream import scrub
from stepq.providers.anthropic.wire import check_tools as wire_check_tools
from stepq.providers.base import AdapterAgent, ProviderAdapter, ProviderError

REQUIRED_VARS = ("CLOUD_ML_REGION", "ANTHROPIC_VERTEX_PROJECT_ID")
ADC_HINT = (
    "Google credentials could not be used: set GOOGLE_APPLICATION_CREDENTIALS to a credentials file or run "
    "`gcloud auth application-default login`"
)
DEFAULT_TOOL_MAX_RETRIES = 2  # the failure-strike breaker, as for Gemini on Vertex


def check_configured() -> None:
    missing = [name for name in REQUIRED_VARS if not os.environ.get(name)]
    if missing:
        raise SubmitError(
            f"provider 'anthropic-vertex' is not configured: set {' and '.join(missing)} "
            "(credentials come from Google Application Default Credentials, e.g. GOOGLE_APPLICATION_CREDENTIALS)"
        )


def check_tools(specs: list[ToolSpec]) -> None:
    wire_check_tools(specs)


_clients: dict[str, AnthropicVertex] = {}
_lock = threading.Lock()


def vertex_client() -> AnthropicVertex:
    """One client per environment; it caches and refreshes its access token itself."""
    names = (*REQUIRED_VARS, "ANTHROPIC_VERTEX_BASE_URL", "GOOGLE_APPLICATION_CREDENTIALS")
    key = hashlib.sha256("\0".join(os.environ.get(n, "") for n in names).encode()).hexdigest()
    with _lock:
        client = _clients.get(key)
        if client is None:
            if len(_clients) >= 8:
                _clients.clear()  # streams in flight keep their own reference
            client = _clients[key] = AnthropicVertex(max_retries=0, **sdk_spans_off())
        return client


class AnthropicVertexAdapter(AnthropicAdapter):
    name = "anthropic-vertex"
    tool_failure_breaker: int | None = DEFAULT_TOOL_MAX_RETRIES
    label = "Anthropic on Vertex AI"
    auth_hint = "check GOOGLE_APPLICATION_CREDENTIALS and the project's Vertex AI permissions"

    def classify(self, exc: BaseException, stall_s: float) -> ProviderError:
        google_error = _classify_google_auth(exc)
        return google_error if google_error is not None else super().classify(exc, stall_s)


def _classify_google_auth(exc: BaseException) -> ProviderError | None:
    try:
        from google.auth import exceptions as gexc
    except ImportError:  # pragma: no cover - google-auth ships with google-genai
        return None
    if isinstance(exc, gexc.DefaultCredentialsError):
        return ProviderError(ADC_HINT, retryable=False, code="auth")
    if isinstance(exc, gexc.RefreshError):
        retryable = bool(getattr(exc, "retryable", False))
        return ProviderError(
            f"refreshing the Google access token failed: {scrub(str(exc))[:300]}", retryable=retryable, code="auth"
        )
    if isinstance(exc, gexc.TransportError):
        return ProviderError("could not reach the Google token endpoint", retryable=True, code="connection")
    return None


def create_adapter(agent: AdapterAgent, model: str) -> ProviderAdapter:
    check_configured()
    return AnthropicVertexAdapter(model, vertex_client)
