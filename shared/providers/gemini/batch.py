"""Gemini batch mode (`client.batches`, inlined requests): the `gemini` provider's batch API (AI Studio).

Each request is what a streamed step sends (`to_contents` + `build_config`) as an `InlinedRequest`
whose `metadata` carries the custom id and the tool-name map (answers come back with it, so they need
nothing else to be mapped). Each answer is a whole `GenerateContentResponse`, fed through the streamed
path's parser as one chunk. A per-request error is classified by its RPC code (RESOURCE_EXHAUSTED,
UNAVAILABLE, INTERNAL… retryable); a job that failed, expired or was cancelled leaves its unanswered
requests out (their steps then run online). Vertex AI batches read from GCS/BigQuery: not supported
here (steps on Vertex run online).
"""

from __future__ import annotations

import json
from typing import Any

from google.genai import types

from stepq.models import StepOutput
from stepq.providers.base import BatchAPI, BatchState, ProviderError, StepRequest
from stepq.providers.errors import classify_status
from stepq.providers.gemini import schema as gemini_schema
from stepq.providers.gemini.client import answers_with_schema, build_config, get_client  # the streamed path's
from stepq.providers.gemini.errors import classify, scrub
from stepq.providers.gemini.wire import StreamParser, to_contents

ENDED = frozenset({"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED",
                   "JOB_STATE_PARTIALLY_SUCCEEDED"})  # fmt: skip
# google.rpc codes worth another attempt: CANCELLED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, INTERNAL,
# UNAVAILABLE; their HTTP equivalents for the step's trace
_RPC_RETRYABLE = {1: 499, 4: 504, 8: 429, 10: 409, 13: 500, 14: 503}
_RPC_HTTP = {3: 400, 5: 404, 7: 403, 9: 400, 11: 400, 16: 401}


def _state(job: Any) -> str:
    state = getattr(job, "state", None)
    return str(getattr(state, "value", state) or "")


class GeminiBatchAPI(BatchAPI):
    def __init__(self, model: str) -> None:
        self.model = model

    @staticmethod
    def _client() -> Any:
        try:
            return get_client()
        except Exception as exc:
            raise classify(exc) from None

    def _call(self, fn: Any) -> Any:
        try:
            return fn(self._client())
        except ProviderError:
            raise
        except Exception as exc:
            raise classify(exc) from exc

    def submit(self, local_id: str, requests: list[tuple[str, StepRequest]]) -> str:
        inlined = []
        for custom, request in requests:
            contents, system_in_transcript = to_contents(request.messages)
            system = [request.system] if request.system else []
            names = {gemini_schema.wire_name(t.name): t.name for t in request.tools}
            meta = {"custom_id": custom, "step": str(request.step), "names": json.dumps(names),
                    "object": "1" if answers_with_schema(request) else ""}  # fmt: skip
            config = build_config(request, system + system_in_transcript)
            inlined.append(types.InlinedRequest(model=request.model, contents=contents, config=config, metadata=meta))
        job = self._call(
            lambda c: c.batches.create(
                model=self.model, src=inlined, config=types.CreateBatchJobConfig(display_name=local_id)
            )
        )
        return str(job.name)

    def poll(self, batch_id: str) -> BatchState:
        job = self._call(lambda c: c.batches.get(name=batch_id))
        return "ended" if _state(job) in ENDED else "in_progress"

    def results(self, batch_id: str) -> dict[str, StepOutput | ProviderError]:
        job = self._call(lambda c: c.batches.get(name=batch_id))
        dest = getattr(job, "dest", None)
        answers: dict[str, StepOutput | ProviderError] = {}
        for item in getattr(dest, "inlined_responses", None) or []:
            meta = item.metadata or {}
            custom = meta.get("custom_id")
            if not custom:
                continue
            if item.error is not None:
                answers[custom] = _error(item.error)
            elif item.response is not None:
                answers[custom] = _output(item.response, meta)
        return answers

    def cancel(self, batch_id: str) -> None:
        self._call(lambda c: c.batches.cancel(name=batch_id))


def _output(response: types.GenerateContentResponse, meta: dict[str, str]) -> StepOutput:
    names = json.loads(meta.get("names") or "{}")
    parser = StreamParser(
        int(meta.get("step") or 0), names, lambda _d: None, "object" if meta.get("object") else "text"
    )
    parser.feed(response)
    return parser.output()


def _error(error: Any) -> ProviderError:
    code = getattr(error, "code", None)
    message = f"Gemini batch request failed (rpc code {code}): {scrub(str(getattr(error, 'message', '') or ''))}"
    if code in _RPC_RETRYABLE:
        return ProviderError(message, retryable=True, status=_RPC_RETRYABLE[code], code=f"rpc-{code}")
    return classify_status(_RPC_HTTP.get(code or 0, 400), message, code=f"rpc-{code}")
