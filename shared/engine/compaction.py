"""Compaction: keep a long turn's request inside the model's context window.

Before a step, the request is measured: from the provider's count endpoint where it has one (Anthropic
`messages.count_tokens`, Gemini `models.count_tokens`), else estimated at 4 characters a token. Both are
skipped while the last call's reported usage plus what was added since is under half the limit, and the
count endpoint is asked only once the estimate reaches half the limit: short turns cost no call and no
pass over the transcript.
When it exceeds `STEPQ_COMPACT_AT` of the model's context window (the table below, or
`STEPQ_CONTEXT_WINDOWS`), the transcript the model sees is compacted in two stages:

1. the results of older tool calls (all but the latest `STEPQ_COMPACT_KEEP_RECENT` messages) are cut to
   `STEPQ_COMPACT_TOOL_RESULT_CHARS`, with a marker;
2. if that is not enough, the older turns are summarised by a model call (a traced step of its own, its
   usage and cost counted) and replaced by one user message holding the summary, keeping the latest
   messages that fit in half the limit. The cut is always just before an assistant message, so a tool
   call and its result are never separated.

The turn's own transcript stays whole (`TurnResult.messages`, the thread's history); what the model sees
is `TurnState.compaction` applied to it (`view`), stored with the turn so a redelivered step sees the same.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from stepq.config.settings import Settings
from stepq.models import (
    AssistantMessage,
    Compaction,
    Message,
    StepOutput,
    SystemMessage,
    TextPart,
    ToolResult,
    ToolResultMessage,
    TurnState,
    UserMessage,
)
from stepq.providers.base import ProviderAdapter, ProviderError, StepRequest

log = logging.getLogger("stepq.compaction")
CHARS_PER_TOKEN = 4
SUMMARY_TARGET = 0.5  # after summarising, the request should fill at most this share of the limit
SUMMARY_MAX_TOKENS = 2048
SUMMARY_ALLOWANCE = 512  # what a summary usually takes, for choosing how much to keep
SUMMARY_INSTRUCTIONS = (
    "You compress conversations. Summarise the conversation below so that an assistant can carry on from it "
    "without seeing it: the user's goals and constraints, facts learned (tool results that matter, ids, "
    "numbers), decisions made and what is still open. Be concise; write plain text, no preamble."
)

# Context windows in tokens, by model-name prefix (the longest matching prefix wins).
CONTEXT_WINDOWS: dict[str, int] = {
    "claude-": 200_000,
    "anthropic.claude": 200_000,
    "us.anthropic.claude": 200_000,
    "eu.anthropic.claude": 200_000,
    "gemini-1.5-pro": 2_097_152,
    "gemini-": 1_048_576,
    "gpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-5": 400_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "amazon.nova-micro": 128_000,
    "amazon.nova-": 300_000,
}


def context_window(settings: Settings, provider: str, model: str) -> int | None:
    """The model's window: `STEPQ_CONTEXT_WINDOWS` (`provider/model`, then `model`), else the table."""
    for key in (f"{provider}/{model}", model):
        if key in settings.context_windows:
            return settings.context_windows[key]
    name = model.removeprefix("models/")
    matches = [prefix for prefix in CONTEXT_WINDOWS if name.startswith(prefix)]
    return CONTEXT_WINDOWS[max(matches, key=len)] if matches else None


# --------------------------------------------------------------------------- the view the model sees


def view(state: TurnState) -> list[Message]:
    """The transcript as the model sees it: the turn's own with its compaction applied."""
    c = state.compaction
    if c is None:
        return state.messages
    out: list[Message] = [summary_message(c.summary)] if c.summary else []
    cut = set(c.cut)
    for index in range(c.summarised, len(state.messages)):
        message = state.messages[index]
        if index in cut and isinstance(message, ToolResultMessage):
            message = ToolResultMessage(results=[_cut(r, c.cut_chars) for r in message.results])
        out.append(message)
    return out


def summary_message(summary: str) -> UserMessage:
    return UserMessage(
        content="[The earlier part of this conversation was summarised to fit the context window]\n" + summary
    )


def _cut(result: ToolResult, chars: int) -> ToolResult:
    text = result.output if isinstance(result.output, str) else json.dumps(result.output, default=str)
    if len(text) <= chars:
        return result
    marker = f"…[compacted: {len(text) - chars} chars removed]"
    return result.model_copy(update={"output": text[:chars] + marker})


def _chars(messages: list[Message]) -> int:
    return sum(len(m.model_dump_json(exclude_none=True)) for m in messages)


def estimate(request: StepRequest) -> int:
    """Tokens at 4 characters each (files count by their JSON, which is what the view carries)."""
    chars = _chars(request.messages) + len(request.system or "")
    chars += sum(len(t.model_dump_json()) for t in request.tools)
    return chars // CHARS_PER_TOKEN


def observed_tokens(state: TurnState) -> int | None:
    """The request's size from what the provider reported for the last model call (its input and output)
    plus the messages added since, at 4 characters a token; None before the first call or without usage."""
    last = next((t for t in reversed(state.trace.steps) if t.kind == "model"), None)
    if last is None or not last.usage.input_tokens:
        return None
    u = last.usage
    since = 0
    for m in reversed(state.messages):
        if isinstance(m, AssistantMessage):
            break
        since += len(m.model_dump_json())
    return u.input_tokens + (u.cache_read_tokens or 0) + (u.cache_write_tokens or 0) + u.output_tokens + since // 4


# --------------------------------------------------------------------------- planning and running


@dataclass
class Compacted:
    """What a compaction did, for the event, the trace and the commit."""

    compaction: Compaction
    tokens_before: int
    tokens_after: int
    counted_by: str  # provider | estimate
    window: int
    limit: int
    cut_call_ids: list[str] = field(default_factory=list)
    summarised: int = 0  # messages of the view the summary replaced
    summary_output: StepOutput | None = None

    def event(self) -> dict[str, Any]:
        return {
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "counted_by": self.counted_by,
            "context_window": self.window,
            "limit": self.limit,
            "tool_results_cut": self.cut_call_ids,
            "messages_summarised": self.summarised,
            "summary_chars": len(self.compaction.summary or "") if self.summarised else 0,
        }


class Compactor:
    """One step's compaction check. `resolve` turns a view into the messages sent (files filled in)."""

    def __init__(
        self,
        settings: Settings,
        adapter: ProviderAdapter,
        resolve: Callable[[list[Message]], list[Message]],
        should_stop: Callable[[], bool],
    ) -> None:
        self.settings = settings
        self.adapter = adapter
        self.resolve = resolve
        self.should_stop = should_stop
        self.counted_by = "estimate"

    def run(self, state: TurnState, request: StepRequest) -> Compacted | None:
        """Compact when the request is over the limit; None when it fits (or the window is unknown).
        Raises ProviderError when the summary call fails (the step retries like any model call)."""
        s = self.settings
        window = context_window(s, request.provider, request.model)
        if not window or not s.compact_at:
            return None
        limit = int(window * s.compact_at)
        observed = observed_tokens(state) if self.adapter.usage_is_measured else None
        if observed is not None and observed < limit // 2:  # the cheap gate: no pass over the transcript
            return None
        before = self.count(request, limit)
        if before <= limit:
            return None
        previous = state.compaction or Compaction(cut_chars=s.compact_tool_result_chars)
        # stage 1: cut the older tool results (by position in the turn's transcript: ids may repeat in a thread)
        keep_from = len(state.messages) - s.compact_keep_recent
        cut_at = [
            i
            for i in range(previous.summarised, max(previous.summarised, keep_from))
            if i not in previous.cut
            and isinstance(m := state.messages[i], ToolResultMessage)
            and any(_cut(r, previous.cut_chars) is not r for r in m.results)
        ]
        cut_ids = [r.tool_call_id for i in cut_at for r in cast(ToolResultMessage, state.messages[i]).results]
        compaction = previous.model_copy(update={"cut": [*previous.cut, *cut_at]})
        done = Compacted(compaction, before, before, self.counted_by, window, limit, cut_ids)
        request = self._with(state, compaction, request)
        done.tokens_after = self.count(request, limit, always=True)
        if done.tokens_after <= limit:
            return done if cut_ids else None
        # stage 2: summarise the older turns
        return self._summarise(state, request, done)

    def count(self, request: StepRequest, limit: int, always: bool = False) -> int:
        guess = estimate(request)
        if not always and guess < limit // 2:
            return guess
        try:
            counted = self.adapter.count_tokens(request)
        except ProviderError as exc:  # counting is best effort: the estimate stands in
            log.warning("token count failed, estimating instead: %s", exc.describe())
            counted = None
        if counted is None:
            return guess
        self.counted_by = "provider"
        return counted

    def _with(self, state: TurnState, compaction: Compaction, request: StepRequest) -> StepRequest:
        saved, state.compaction = state.compaction, compaction
        try:
            messages = self.resolve(view(state))
        finally:
            state.compaction = saved
        return request.model_copy(update={"messages": messages})

    def _summarise(self, state: TurnState, request: StepRequest, done: Compacted) -> Compacted:
        current = _view_with(state, done.compaction)
        cut = self._cut_point(current, request, done)
        if cut is None:  # nothing can be summarised without splitting a pair: the step goes ahead as is
            return done
        summary_request = StepRequest.model_construct(
            provider=request.provider,
            model=request.model,
            system=SUMMARY_INSTRUCTIONS,
            messages=[UserMessage(content=render(current[:cut], _render_budget(done.window)))],
            tools=[],
            tool_choice=None,
            max_tokens=SUMMARY_MAX_TOKENS,
            temperature=None,
            stop_sequences=[],
            output_schema=None,
            step=request.step,
            attempt=request.attempt,
            options={k: v for k, v in request.options.items() if k != "thinking_budget"},
            purpose="summary",
        )
        output = self.adapter.stream_step(summary_request, lambda _delta: None, self.should_stop)
        summary = output.message.text.strip() or "(no summary)"
        had_summary = 1 if done.compaction.summary else 0
        summarised = done.compaction.summarised + cut - had_summary  # index into the turn's own transcript
        done.compaction = done.compaction.model_copy(update={"summarised": summarised, "summary": summary})
        done.summarised = cut
        done.summary_output = output
        done.tokens_after = self.count(self._with(state, done.compaction, request), done.limit, always=True)
        done.counted_by = self.counted_by
        return done

    def _cut_point(self, current: list[Message], request: StepRequest, done: Compacted) -> int | None:
        """The earliest assistant message (index >= 1) from which the rest fits in half the limit, scaled by
        how the count compared with the estimate; else the latest one. None when there is no such message."""
        candidates = [i for i, m in enumerate(current) if i >= 1 and isinstance(m, AssistantMessage)]
        if not candidates:
            return None
        ratio = done.tokens_after / max(1, estimate(request))
        fixed = (len(request.system or "") + sum(len(t.model_dump_json()) for t in request.tools)) // CHARS_PER_TOKEN
        target = done.limit * SUMMARY_TARGET
        for i in candidates:
            if ratio * (fixed + _chars(current[i:]) // CHARS_PER_TOKEN + SUMMARY_ALLOWANCE) <= target:
                return i
        return candidates[-1]


def _view_with(state: TurnState, compaction: Compaction) -> list[Message]:
    saved, state.compaction = state.compaction, compaction
    try:
        return view(state)
    finally:
        state.compaction = saved


def _render_budget(window: int) -> int:
    """Characters of conversation the summary call is given: what its window holds besides its answer."""
    return max(2000, int((window - SUMMARY_MAX_TOKENS) * CHARS_PER_TOKEN * 0.9))


RENDERED_RESULT_CHARS = 1000  # a tool result in the summary call's input: its start is what matters


def render(messages: list[Message], max_chars: int) -> str:
    """The messages as plain text for the summary call (its latest part when longer than `max_chars`)."""
    lines: list[str] = []
    for m in messages:
        if isinstance(m, UserMessage | SystemMessage):
            files = f" [{len(m.files)} file(s)]" if isinstance(m, UserMessage) and m.files else ""
            lines.append(f"{m.role.upper()}: {m.content}{files}")
        elif isinstance(m, AssistantMessage):
            text = "".join(p.text for p in m.parts if isinstance(p, TextPart))
            if text:
                lines.append(f"ASSISTANT: {text}")
            for call in m.tool_calls:
                lines.append(f"ASSISTANT called {call.name}({json.dumps(call.args, default=str)})")
        else:
            for r in m.results:
                output = r.output if isinstance(r.output, str) else json.dumps(r.output, default=str)
                if len(output) > RENDERED_RESULT_CHARS:
                    output = output[:RENDERED_RESULT_CHARS] + f"…[{len(output) - RENDERED_RESULT_CHARS} more chars]"
                lines.append(f"TOOL {r.name} returned{' an error' if r.is_error else ''}: {output}")
    text = "\n".join(lines)
    return text if len(text) <= max_chars else "…" + text[-max_chars:]
