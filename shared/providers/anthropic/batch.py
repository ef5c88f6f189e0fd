"""Anthropic Message Batches (`client.messages.batches`): the `anthropic` provider's batch API.

Each request's `params` are exactly what a streamed step sends (`anthropic_wire.build_params`, minus
per-call headers); each answer is a whole `Message`, fed through the streamed path's accumulator as
the events it would have streamed, so a batch answer maps to the same `StepOutput`. An `errored`
result is classified like an error event inside a stream (overloaded/rate/api errors retryable,
request errors fatal); `canceled` and `expired` results are left out (the step then runs online).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from stepq.models import StepOutput
from stepq.providers.anthropic.stream import AUTH_HINT, RawEvent, StreamAccumulator, classify_error, in_stream_error
from stepq.providers.anthropic.wire import build_params
from stepq.providers.base import BatchAPI, BatchState, ProviderError, StepRequest


def message_output(message: dict[str, Any]) -> StepOutput:
    """A whole Messages API `message` as the step output its stream would have produced."""
    acc = StreamAccumulator(lambda _delta: None)
    acc.feed(RawEvent(type="message_start", message=message))
    for index, block in enumerate(message.get("content") or []):
        acc.feed(RawEvent(type="content_block_start", index=index, content_block=block))
        acc.feed(RawEvent(type="content_block_stop", index=index))
    acc.feed(RawEvent(type="message_delta", delta={"stop_reason": message.get("stop_reason")}, usage=None))
    acc.feed(RawEvent(type="message_stop"))
    return acc.output()


class AnthropicBatchAPI(BatchAPI):
    def __init__(self, client_factory: Callable[[], Any], label: str = "Anthropic", auth_hint: str = AUTH_HINT) -> None:
        self.client_factory = client_factory
        self.label = label
        self.auth_hint = auth_hint

    def _batches(self) -> Any:
        return self.client_factory().messages.batches

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:
            raise classify_error(exc, 0.0, self.label, self.auth_hint) from exc

    def submit(self, local_id: str, requests: list[tuple[str, StepRequest]]) -> str:
        body = []
        for custom, request in requests:
            params = build_params(request)
            params.pop("extra_headers", None)  # one HTTP call carries the batch: per-request headers do not apply
            body.append({"custom_id": custom, "params": params})
        batch = self._call(lambda: self._batches().create(requests=body))
        return str(batch.id)

    def poll(self, batch_id: str) -> BatchState:
        batch = self._call(lambda: self._batches().retrieve(batch_id))
        return "ended" if batch.processing_status == "ended" else "in_progress"

    def results(self, batch_id: str) -> dict[str, StepOutput | ProviderError]:
        answers: dict[str, StepOutput | ProviderError] = {}
        for item in self._call(lambda: list(self._batches().results(batch_id))):
            result = item.result
            if result.type == "succeeded":
                answers[item.custom_id] = message_output(cast(dict[str, Any], result.message.model_dump()))
            elif result.type == "errored":
                error = result.error.error
                answers[item.custom_id] = in_stream_error(
                    getattr(error, "type", None), str(getattr(error, "message", "")), self.label, self.auth_hint
                )
        return answers

    def cancel(self, batch_id: str) -> None:
        self._call(lambda: self._batches().cancel(batch_id))
