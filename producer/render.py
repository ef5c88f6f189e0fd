"""Terminal rendering for the CLI and the demo: a live event view, result summaries, the step trace table.

Kept apart from the commands so `stepq run`, `stepq events` and `stepq demo` print a turn the same way.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, TextIO

from stepq.models import Event, EventType, FailedAttempt, LoopTrace, StepTrace, TurnResult, TurnState, Usage


class Style:
    """ANSI styling, on only for a terminal (and never with NO_COLOR set)."""

    def __init__(self, stream: TextIO) -> None:
        self.enabled = stream.isatty() and not os.environ.get("NO_COLOR")

    def _wrap(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.enabled else text

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def green(self, text: str) -> str:
        return self._wrap("32", text)

    def red(self, text: str) -> str:
        return self._wrap("31", text)

    def yellow(self, text: str) -> str:
        return self._wrap("33", text)

    def cyan(self, text: str) -> str:
        return self._wrap("36", text)


def compact(value: Any, limit: int = 160) -> str:
    """One-line JSON, cut at `limit` characters so a big tool result cannot flood the terminal."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


_PLAN_MARKS = {"pending": "[ ]", "running": "[>]", "done": "[x]", "failed": "[!]", "skipped": "[-]"}


def plan_line(steps: list[dict[str, Any]]) -> str:
    """A task plan on one line: `[x] Search · [>] Compare · [ ] Answer`."""
    return " · ".join(f"{_PLAN_MARKS.get(str(r.get('status')), '[ ]')} {r.get('label')}" for r in steps)


def pretty(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, default=str)


def usage_line(usage: Usage | dict[str, Any]) -> str:
    u = usage if isinstance(usage, Usage) else Usage.model_validate(usage)
    extra = []
    if u.cache_read_tokens:
        extra.append(f"{u.cache_read_tokens} cache read")
    if u.cache_write_tokens:
        extra.append(f"{u.cache_write_tokens} cache write")
    if u.reasoning_tokens:
        extra.append(f"{u.reasoning_tokens} reasoning")
    tail = f" ({', '.join(extra)})" if extra else ""
    return f"{u.input_tokens} input + {u.output_tokens} output tokens{tail}"


def token_hint(token: str) -> str:
    """A capability token shortened for narration (the full token stays in Redis, never in an event)."""
    return token if len(token) <= 24 else f"{token[:12]}…{token[-6:]}"


class LiveView:
    """Prints a turn's events as they arrive: text inline, everything else as one short line each."""

    def __init__(self, out: TextIO, indent: str = "", show_steps: bool = True) -> None:
        self.out = out
        self.indent = indent
        self.show_steps = show_steps
        self.style = Style(out)
        self._inline: str | None = None  # "text" | "reasoning" while a delta line is open
        self.answer_streamed = False  # the latest step's answer (text or object) was printed as it streamed

    def line(self, text: str = "") -> None:
        """Print one full line, closing any open delta line first."""
        self.close_inline()
        self.out.write(f"{self.indent}{text}\n" if text else "\n")
        self.out.flush()

    def close_inline(self) -> None:
        if self._inline is not None:
            self.out.write("\n")
            self._inline = None

    def _delta(self, kind: str, text: str) -> None:
        if self._inline != kind:
            self.close_inline()
            label = self.style.dim("thinking: ") if kind == "reasoning" else ""
            self.out.write(f"{self.indent}{label}")
            self._inline = kind
        body = text.replace("\n", "\n" + self.indent)
        self.out.write(self.style.dim(body) if kind == "reasoning" else body)
        self.out.flush()

    def on_event(self, event: Event) -> None:
        s, d = self.style, event.data
        kind = event.type
        if kind in (EventType.TEXT_DELTA, EventType.OBJECT_DELTA):
            self.answer_streamed = True
        if kind == EventType.TEXT_DELTA:
            self._delta("text", str(d.get("text", "")))
        elif kind == EventType.REASONING_DELTA:
            self._delta("reasoning", str(d.get("text", "")))
        elif kind == EventType.OBJECT_DELTA:  # the structured answer's JSON as it streams
            self._delta("text", str(d.get("text", "")))
        elif kind == EventType.TURN_START:
            self.line(s.dim(f"turn {event.turn_id} · {d.get('agent')} on {d.get('provider')}/{d.get('model')}"))
        elif kind == EventType.STEP_START:
            self.answer_streamed = False  # a later step's answer is the turn's
            if self.show_steps:
                retry = f" (attempt {d['attempt'] + 1})" if d.get("attempt") else ""
                self.line(s.dim(f"── step {event.step}{retry}"))
        elif kind == EventType.TOOL_CALL:
            self.line(f"{s.cyan('→ ' + str(d.get('name')))} {compact(d.get('args', {}))}")
        elif kind == EventType.TOOL_RESULT:
            mark = s.red("✗ " + str(d.get("name"))) if d.get("is_error") else s.green("← " + str(d.get("name")))
            self.line(f"{mark} {compact(d.get('output'))}")
        elif kind == EventType.APPROVAL_REQUEST:
            self.line(
                f"{s.yellow('⏸ approval needed')} for {s.bold(str(d.get('tool')))} {compact(d.get('args', {}))}"
                f" {s.dim('(' + str(d.get('approval_id')) + ', expires in ' + _expires_in(d.get('expires_at')) + ')')}"
            )
        elif kind == EventType.APPROVAL_DECISION:
            decision = str(d.get("decision"))
            who = f" by {d['reviewer']}" if d.get("reviewer") else ""
            why = f": {d['reason']}" if d.get("reason") else ""
            paint = s.green if decision == "approved" else s.red
            self.line(paint(f"{'✓' if decision == 'approved' else '✗'} {decision}{who}{why}"))
        elif kind == EventType.STEP_RETRY:
            cause = " ".join(str(x) for x in (d.get("status"), d.get("code"), d.get("error")) if x)
            self.line(
                s.yellow(f"↻ step {event.step} retry {d.get('attempt')} in {d.get('countdown', 0):.2f}s: {cause}")
            )
        elif kind == EventType.PLAN_UPDATE:
            self.line(s.cyan("plan: ") + plan_line(d.get("steps", [])))
        elif kind == EventType.STEP_RESET:
            self.line(s.yellow(f"↺ step {event.step} reset ({d.get('reason')}): its partial output above is void"))
        elif kind == EventType.ERROR:
            self.line(s.red(f"✗ error: {d.get('message')}"))
        elif kind in (EventType.STEP_FINISH, EventType.TURN_FINISH):
            self.close_inline()


def _expires_in(expires_at: object) -> str:
    if not isinstance(expires_at, int | float):
        return "?"
    left = max(0.0, float(expires_at) - time.time())
    return f"{left / 60:.0f} min" if left >= 120 else f"{left:.0f} s"


def event_summary(event: Event) -> str:
    """One line per event for `stepq events`."""
    d = event.data
    kind = event.type
    if kind in (EventType.TEXT_DELTA, EventType.REASONING_DELTA, EventType.OBJECT_DELTA):
        return json.dumps(d.get("text", ""), ensure_ascii=False)
    if kind == EventType.TOOL_CALL:
        return f"{d.get('name')} {compact(d.get('args', {}))} (id {d.get('id')})"
    if kind == EventType.TOOL_INPUT_DELTA:  # a piece of the call's argument JSON, as the model writes it
        return f"{d.get('name')} {json.dumps(d.get('text', ''), ensure_ascii=False)} (id {d.get('id')})"
    if kind == EventType.TOOL_RESULT:
        return f"{d.get('name')}{' ERROR' if d.get('is_error') else ''} {compact(d.get('output'))}"
    if kind == EventType.APPROVAL_REQUEST:
        return f"{d.get('tool')} {compact(d.get('args', {}))} approval_id={d.get('approval_id')} token={d.get('token')}"
    if kind == EventType.PLAN_UPDATE:
        return plan_line(d.get("steps", []))
    if kind == EventType.TURN_FINISH:
        return f"{d.get('status')} finish={d.get('finish_reason')}" + (f" error={d['error']}" if d.get("error") else "")
    if kind == EventType.STEP_FINISH:
        return f"finish={d.get('finish_reason')} {usage_line(d.get('usage') or {})}"
    return compact(d)


def result_lines(result: TurnResult, style: Style, answer: bool = True) -> list[str]:
    """The end of a turn: its answer (text or pretty object, unless `answer` is off), finish reason, usage."""
    lines: list[str] = []
    ok = result.status.value == "completed"
    head = f"{result.status.value} · finish: {result.finish_reason.value if result.finish_reason else '-'}"
    lines.append(style.bold(style.green(head) if ok else style.red(head)))
    if answer and result.object is not None:
        lines.extend(pretty(result.object).splitlines())
    elif answer and result.text:
        lines.extend(result.text.splitlines())
    if result.error:
        lines.append(style.red(f"error: {result.error}"))
    steps = len(result.trace.steps)
    cost = f" · cost {money(result.cost)}" if result.cost is not None else ""
    stopped = f" · stopped by {result.stopped_by.value}" if result.stopped_by else ""
    lines.append(style.dim(f"{steps} step{'s' if steps != 1 else ''} · {usage_line(result.usage)}{cost}{stopped}"))
    return lines


def money(cost: float | None) -> str:
    """A cost as the price table's currency units, up to 8 decimals ("-" when no price is configured)."""
    if cost is None:
        return "-"
    return f"{cost:.8f}".rstrip("0").rstrip(".") or "0"


_POLICY_LAYERS = ("caller", "tenant", "environment")


def _shown(value: object) -> str:
    return ",".join(map(str, value)) or "none" if isinstance(value, list) else str(value)


def version_cell(fingerprint: str | None, version: str | None) -> str:
    """Which definition of the agent ran a step: its version string and short fingerprint."""
    if fingerprint is None:
        return "-"
    return f"{version} ({fingerprint})" if version else fingerprint


def trace_table(trace: LoopTrace) -> list[str]:
    """Per-step trace as an aligned table; `in`/`out` are the answering attempt's tokens, `cost` the step's
    (failed attempts included), `agent version` the definition the step ran under (see docs/operate/deploying.md). Each failed attempt the provider billed follows its step on its own line."""
    header = ["step", "provider/model", "tool calls", "in", "out", "cost", "retries", "time", "stop", "agent version"]
    rows = [
        [
            str(s.step),
            f"{s.provider}/{s.model}" + (" (batch)" if s.batch else ""),
            ", ".join(s.tool_calls) or "-",
            str(s.usage.input_tokens),
            str(s.usage.output_tokens),
            money(s.cost),
            str(s.retries),
            f"{s.duration_s:.2f}s",
            s.stop_reason or "-",
            version_cell(s.fingerprint, s.agent_version),
        ]
        for s in trace.steps
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(header)).rstrip()]
    for s, row in zip(trace.steps, rows, strict=True):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        operators = [
            f"{axis}={_shown(p.value)} ({p.layer})" for axis, p in s.policy.items() if p.layer in _POLICY_LAYERS
        ]
        if operators:  # what a caller's, tenant's or the environment's policy tightened on this step
            lines.append(f"  ↳ policy: {', '.join(operators)}")
        lines += _attempt_lines(s) + _tool_lines(s)
    return lines


def _attempt_lines(s: StepTrace) -> list[str]:
    """Each failed model call of the step (what it failed with, what followed, how long it took, what it was
    billed); a trace written before attempts were recorded lists only the billed ones."""
    billed = {(a.attempt, a.provider, a.model): a for a in s.failed_attempts}
    failed = [a for a in s.attempts if a.outcome != "ok"]
    failed_rows: list[tuple[int, str | None, str | None, str, str, FailedAttempt | None]]
    if not failed:  # older traces: the billed failures alone
        failed_rows = [(a.attempt, a.provider, a.model, a.error or "error", "", a) for a in s.failed_attempts]
    else:
        failed_rows = [
            (a.attempt, a.provider, a.model, a.error or "error", f" → {a.outcome}, {a.duration_s:.2f}s",
             billed.get((a.attempt, a.provider, a.model)))
            for a in failed
        ]  # fmt: skip
    lines = []
    for attempt, provider, model, error, detail, bill in failed_rows:
        moved = provider is not None and (provider, model) != (s.provider, s.model)
        where = f" on {provider}/{model}" if moved else ""  # failed before a failover
        cost = f": {usage_line(bill.usage)} · cost {money(bill.cost)}" if bill is not None else ""
        lines.append(f"  ↳ attempt {attempt}{where} failed ({error}){detail}{cost}")
    return lines


def _tool_lines(s: StepTrace) -> list[str]:
    """Each tool call's outcome and how long its function ran; a parked step's wait; a re-run step."""
    lines = []
    for c in s.calls:
        took = f" in {c.duration_s:.3f}s" if c.duration_s is not None else " (not run here)"
        lines.append(f"  ↳ tool {c.name} ({c.id}): {c.status.value if c.status else 'not run'}{took}")
    if s.parked_at is not None and s.resumed_at is not None:
        lines.append(f"  ↳ waited {s.resumed_at - s.parked_at:.2f}s for {s.parked_for or 'approval'}")
    if s.rerun:
        lines.append("  ↳ re-run: a worker stopped in the middle of this step")
    return lines


def state_lines(state: TurnState) -> list[tuple[str, str]]:
    """The key/value header of `stepq show`."""

    def when(ts: float | None) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"

    return [
        ("turn", state.turn_id),
        ("agent", state.agent),
        ("status", state.status.value),
        ("provider", f"{state.provider} / {state.model}"),
        (
            "finish",
            state.finish_reason.value + (f" (stopped by {state.stopped_by.value})" if state.stopped_by else "")
            if state.finish_reason
            else "-",
        ),
        ("usage", f"{usage_line(state.usage)} · {state.tool_calls_made} tool calls"),
        ("cost", money(state.cost)),
        ("step", str(state.step)),
        ("created", when(state.created_at)),
        ("finished", when(state.finished_at)),
        *_origin_line(state),
    ]


def _origin_line(state: TurnState) -> list[tuple[str, str]]:
    """A forked turn's origin (`stepq.turns.fork`): the turn and step it was forked from."""
    origin = state.metadata.get("origin")
    if not isinstance(origin, dict):
        return []
    return [("forked", f"from {origin.get('turn_id')} at step {origin.get('step')}")]
