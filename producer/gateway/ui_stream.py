"""stepq events -> AI SDK UI message stream chunks (the protocol `useChat` reads).

Targets the `ai` npm package 7.x (checked against ai@7.0.173's `uiMessageChunkSchema` and
`processUIMessageStream`). One stepq turn is one assistant UI message whose id is the turn id, so a
continuation after an approval and a replay on resume land on the same message.

Mapping:
  turn-start / first event   -> start {messageId, messageMetadata}
  step-start                 -> start-step (once per step: a retried attempt keeps the step open), then
                                data-agent-version (id per step: the definition's fingerprint and version)
  text-delta / object-delta  -> text-start, text-delta (text-end when the part closes)
  reasoning-delta            -> reasoning-start, reasoning-delta (reasoning-end when it closes)
  tool-input-delta           -> tool-input-start (at a call's first piece), tool-input-delta {inputTextDelta}
  tool-call                  -> tool-input-start (unless its input streamed), tool-input-available
  approval-request           -> tool-approval-request (the approval id only: never the token)
  approval-decision          -> tool-approval-response
  tool-results-request       -> nothing new: its calls stay `input-available` for the client to run
                                (`addToolOutput`); the message closes parked until the results come back
  tool-result                -> tool-output-available | tool-output-error | tool-output-denied
  step-finish                -> text-end / reasoning-end; the step's finish-step goes out when it closes
                                (the next step starts, the message finishes or parks), so what still belongs
                                to it (tool calls, approvals, an object-mode repair's reset) stays inside it
  step-reset                 -> reset-step (the client drops the step's parts, a partly streamed tool call's
                                too), then a transient data-step-reset
  step-retry                 -> transient data-retry
  plan-update                -> data-plan (id "plan": each update replaces the message's plan part)
  error                      -> error
  turn-finish                -> finish {finishReason, messageMetadata: turn id, status, finish reason, usage}

A step reset after content never leaves stale text: `reset-step` removes every part since the step's
`start-step`, and the retried attempt streams into fresh part ids under that same step. Every step is one
well-nested `start-step … finish-step`, its reset included: an object-mode repair's reset (published after the
invalid answer's step-finish) empties that step before it closes, and the repair streams in the next step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from stepq.models import Event, EventType, ToolResultStatus

Chunk = dict[str, Any]

# the finish reasons the UI protocol knows; ours that it does not (max-steps, budget, cancelled,
# awaiting-approval) are "other", and messageMetadata.finishReason keeps our exact value
_UI_FINISH = {"stop", "length", "content-filter", "tool-calls", "error"}

UI_STREAM_HEADERS = {
    "x-vercel-ai-ui-message-stream": "v1",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",  # proxies must not buffer a stream
}


def sse_frame(chunk: Chunk) -> bytes:
    """One SSE `data:` frame; the UI protocol carries no event names or ids."""
    return b"data: " + json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def ui_finish_reason(reason: str | None) -> str:
    # a stop condition ends the turn after a tool step, as the AI SDK's own stopWhen does: `tool-calls`
    if reason in ("awaiting-approval", "step-count", "has-tool-call", "custom-stop"):
        return "tool-calls"
    return reason if reason in _UI_FINISH else "other"


@dataclass
class _Step:
    calls: set[str] = field(default_factory=set)  # tool-call ids of the open step
    streaming: set[str] = field(default_factory=set)  # ...whose input streamed (their tool-input-start went out)
    settled: set[str] = field(default_factory=set)  # ...with a result
    awaiting: set[str] = field(default_factory=set)  # ...with an approval request and no decision yet
    client: set[str] = field(default_factory=set)  # ...client-side calls waiting for their caller's result


class UIMessageTranslator:
    """Turns one turn's events, in seq order, into UI message chunks. Feed every event; read the chunks."""

    def __init__(self, turn_id: str, metadata: dict[str, Any] | None = None) -> None:
        self.turn_id = turn_id
        self.metadata = dict(metadata or {})
        self.started = False
        self.finished = False
        self._open_step: int | None = None
        self._step_finished = False
        self._text_id: str | None = None
        self._reasoning_id: str | None = None
        self._parts = 0
        self._step = _Step()
        self._approvals: dict[str, str] = {}  # approval id -> tool call id

    @property
    def message_id(self) -> str:
        return self.turn_id

    @property
    def parked(self) -> bool:
        """Every tool call of the step has a result or waits on a person or the client, and at least one waits."""
        step = self._step
        waiting = step.awaiting | step.client
        return bool(waiting) and step.calls <= (step.settled | waiting)

    # ------------------------------------------------------------------ the public edges

    def begin(self) -> list[Chunk]:
        """The `start` chunk, once; a stream that starts mid-turn (a continuation) begins with it too."""
        if self.started:
            return []
        self.started = True
        return [{"type": "start", "messageId": self.message_id, "messageMetadata": self._metadata()}]

    def feed(self, event: Event) -> list[Chunk]:
        out = self.begin()
        handler = _HANDLERS.get(event.type)
        if handler is not None:
            out += handler(self, event)
        return out

    def end_parked(self, status: str | None = None) -> list[Chunk]:
        """Close the message for now: the turn waits for approvals or client-side tool results; the next POST
        (approval responses, tool outputs) continues it."""
        self.finished = True
        out = self.begin() + self._close_parts() + self._finish_step()
        if status is None:  # the turn's status when known, else what this stream saw it wait for
            status = "awaiting_tool_results" if self._step.client and not self._step.awaiting else "awaiting_approval"
        out.append(
            {
                "type": "finish",
                "finishReason": "tool-calls",
                "messageMetadata": {
                    "turnId": self.turn_id,
                    "status": status,
                    "finishReason": status.replace("_", "-"),
                },
            }
        )
        return out

    def end_unfinished(self) -> list[Chunk]:
        """Close a message whose turn ended with no finish event (its writer died after the commit)."""
        if self.finished:
            return []
        self.finished = True
        return [*self.begin(), *self._close_parts(), *self._finish_step(), {"type": "finish", "finishReason": "other"}]

    # ------------------------------------------------------------------ helpers

    def _metadata(self) -> dict[str, Any]:
        return {"turnId": self.turn_id, **self.metadata}

    def _new_id(self, kind: str) -> str:
        self._parts += 1
        return f"{kind}-{self._parts}"

    def _close_parts(self) -> list[Chunk]:
        out: list[Chunk] = []
        if self._text_id is not None:
            out.append({"type": "text-end", "id": self._text_id})
            self._text_id = None
        if self._reasoning_id is not None:
            out.append({"type": "reasoning-end", "id": self._reasoning_id})
            self._reasoning_id = None
        return out

    def _ensure_step(self, step: int) -> list[Chunk]:
        if self._open_step == step:
            return []
        out = self._close_parts() + self._finish_step()
        self._open_step = step
        self._step_finished = False
        self._step = _Step()
        out.append({"type": "start-step"})
        return out

    def _finish_step(self) -> list[Chunk]:
        """`finish-step` once per step, when it closes: after a step-finish event its tool calls, approvals or a
        repair's reset may still come, and they belong inside it."""
        if self._open_step is None or self._step_finished:
            return []
        self._step_finished = True
        return [{"type": "finish-step"}]

    # ------------------------------------------------------------------ per event type

    def _on_step_start(self, event: Event) -> list[Chunk]:
        out = self._ensure_step(event.step)
        version = event.data.get("agent_version")
        if isinstance(version, dict):  # which definition of the agent runs this step (one part per step)
            data = {"step": event.step, "fingerprint": version.get("fingerprint"), "version": version.get("version")}
            out.append({"type": "data-agent-version", "id": f"agent-version-{event.step}", "data": data})
        return out

    def _on_text(self, event: Event) -> list[Chunk]:
        delta = str(event.data.get("text", ""))
        if not delta:
            return []
        out = self._ensure_step(event.step)
        if self._reasoning_id is not None:
            out.append({"type": "reasoning-end", "id": self._reasoning_id})
            self._reasoning_id = None
        if self._text_id is None:
            self._text_id = self._new_id("text")
            out.append({"type": "text-start", "id": self._text_id})
        out.append({"type": "text-delta", "id": self._text_id, "delta": delta})
        return out

    def _on_reasoning(self, event: Event) -> list[Chunk]:
        delta = str(event.data.get("text", ""))
        if not delta:
            return []
        out = self._ensure_step(event.step)
        if self._text_id is not None:
            out.append({"type": "text-end", "id": self._text_id})
            self._text_id = None
        if self._reasoning_id is None:
            self._reasoning_id = self._new_id("reasoning")
            out.append({"type": "reasoning-start", "id": self._reasoning_id})
        out.append({"type": "reasoning-delta", "id": self._reasoning_id, "delta": delta})
        return out

    def _on_tool_input(self, event: Event) -> list[Chunk]:
        call_id, piece = str(event.data.get("id")), str(event.data.get("text", ""))
        if not piece:
            return []
        out = self._ensure_step(event.step) + self._close_parts()
        if call_id not in self._step.streaming:
            self._step.streaming.add(call_id)
            out.append({"type": "tool-input-start", "toolCallId": call_id, "toolName": str(event.data.get("name"))})
        out.append({"type": "tool-input-delta", "toolCallId": call_id, "inputTextDelta": piece})
        return out

    def _on_tool_call(self, event: Event) -> list[Chunk]:
        call_id, name = str(event.data.get("id")), str(event.data.get("name"))
        out = self._ensure_step(event.step) if self._open_step is None else self._close_parts()
        self._step.calls.add(call_id)
        args = event.data.get("args", {})
        if call_id not in self._step.streaming:  # its input did not stream: the part opens here
            out.append({"type": "tool-input-start", "toolCallId": call_id, "toolName": name})
        return [*out, {"type": "tool-input-available", "toolCallId": call_id, "toolName": name, "input": args}]

    def _on_approval_request(self, event: Event) -> list[Chunk]:
        approval_id, call_id = str(event.data.get("approval_id")), str(event.data.get("tool_call_id"))
        self._approvals[approval_id] = call_id
        self._step.awaiting.add(call_id)
        return [{"type": "tool-approval-request", "approvalId": approval_id, "toolCallId": call_id}]

    def _on_approval_decision(self, event: Event) -> list[Chunk]:
        approval_id = str(event.data.get("approval_id"))
        call_id = self._approvals.get(approval_id, str(event.data.get("tool_call_id")))
        self._step.awaiting.discard(call_id)
        chunk: Chunk = {
            "type": "tool-approval-response",
            "approvalId": approval_id,
            "approved": event.data.get("decision") == "approved",
        }
        if event.data.get("reason"):
            chunk["reason"] = str(event.data["reason"])
        elif event.data.get("decision") == "expired":
            chunk["reason"] = "the approval expired"
        return [chunk]

    def _on_tool_results_request(self, event: Event) -> list[Chunk]:
        calls = event.data.get("calls") or []
        self._step.client.update(str(c.get("tool_call_id")) for c in calls if isinstance(c, dict))
        return []

    def _on_tool_result(self, event: Event) -> list[Chunk]:
        call_id = str(event.data.get("id"))
        self._step.settled.add(call_id)
        self._step.awaiting.discard(call_id)
        self._step.client.discard(call_id)
        output = event.data.get("output")
        if not event.data.get("is_error"):
            return [{"type": "tool-output-available", "toolCallId": call_id, "output": output}]
        if event.data.get("status") == ToolResultStatus.DENIED.value:
            return [{"type": "tool-output-denied", "toolCallId": call_id}]
        return [{"type": "tool-output-error", "toolCallId": call_id, "errorText": _error_text(output)}]

    def _on_step_finish(self, event: Event) -> list[Chunk]:
        return self._close_parts()  # the step's finish-step waits for the step to close (see `_finish_step`)

    def _on_step_reset(self, event: Event) -> list[Chunk]:
        # the step's start-step part stays (reset-step removes what came after it): keep the step open
        self._text_id = self._reasoning_id = None
        out = self._ensure_step(event.step)
        self._step = _Step()
        out.append({"type": "reset-step"})
        reason = str(event.data.get("reason", ""))
        out.append({"type": "data-step-reset", "data": {"step": event.step, "reason": reason}, "transient": True})
        return out

    def _on_step_retry(self, event: Event) -> list[Chunk]:
        data = {k: event.data.get(k) for k in ("attempt", "countdown", "error", "status") if k in event.data}
        return [{"type": "data-retry", "data": {"step": event.step, **data}, "transient": True}]

    def _on_plan_update(self, event: Event) -> list[Chunk]:
        return [{"type": "data-plan", "id": "plan", "data": {"steps": event.data.get("steps", [])}}]

    def _on_error(self, event: Event) -> list[Chunk]:
        return [*self._close_parts(), {"type": "error", "errorText": str(event.data.get("message", "error"))}]

    def _on_turn_finish(self, event: Event) -> list[Chunk]:
        out = self._close_parts() + self._finish_step()
        reason = event.data.get("finish_reason")
        meta: dict[str, Any] = {
            "turnId": self.turn_id,
            "status": event.data.get("status"),
            "finishReason": reason,
            "usage": event.data.get("usage"),
        }
        if event.data.get("object") is not None:
            meta["object"] = event.data["object"]
        self.finished = True
        out.append({"type": "finish", "finishReason": ui_finish_reason(reason), "messageMetadata": meta})
        return out


def _error_text(output: Any) -> str:
    if isinstance(output, dict) and isinstance(output.get("error"), str):
        return output["error"]
    return output if isinstance(output, str) else json.dumps(output, default=str)


_HANDLERS = {
    EventType.STEP_START: UIMessageTranslator._on_step_start,
    EventType.TEXT_DELTA: UIMessageTranslator._on_text,
    EventType.OBJECT_DELTA: UIMessageTranslator._on_text,
    EventType.REASONING_DELTA: UIMessageTranslator._on_reasoning,
    EventType.TOOL_INPUT_DELTA: UIMessageTranslator._on_tool_input,
    EventType.TOOL_CALL: UIMessageTranslator._on_tool_call,
    EventType.APPROVAL_REQUEST: UIMessageTranslator._on_approval_request,
    EventType.APPROVAL_DECISION: UIMessageTranslator._on_approval_decision,
    EventType.TOOL_RESULTS_REQUEST: UIMessageTranslator._on_tool_results_request,
    EventType.TOOL_RESULT: UIMessageTranslator._on_tool_result,
    EventType.STEP_FINISH: UIMessageTranslator._on_step_finish,
    EventType.STEP_RESET: UIMessageTranslator._on_step_reset,
    EventType.STEP_RETRY: UIMessageTranslator._on_step_retry,
    EventType.PLAN_UPDATE: UIMessageTranslator._on_plan_update,
    EventType.ERROR: UIMessageTranslator._on_error,
    EventType.TURN_FINISH: UIMessageTranslator._on_turn_finish,
}
