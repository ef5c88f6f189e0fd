"""`stepq demo`: a narrated tour of a few turns, with no services and no API keys.

Embedded (STEPQ_REDIS_URL unset), the whole system runs in this process: a Redis
stand-in (fakeredis), Celery's memory transport, one threads-pool worker, and the
offline `scripted` and `function` providers playing the bundled `stepq.agents.demo`. With
STEPQ_REDIS_URL set, the same tour runs against real Redis and a separately
started `stepq worker`.
"""

from __future__ import annotations

import re
import sys
from contextlib import AbstractContextManager, nullcontext
from typing import TextIO

from stepq.config.settings import Settings, load_settings
from stepq.embedded import local_worker, with_demo_agents
from stepq.models import Event, EventType, TurnResult, TurnStatus, UserMessage
from stepq.producer.client import Client
from stepq.producer.render import LiveView, compact, pretty, result_lines, token_hint

NO_WORKER_S = 15.0
SUPPORT_PROMPT = "My espresso grinder from order A-1001 arrived broken. Can I get my money back?"
EXTRACT_PROMPT = "Met Ada Lovelace (Analytical Engines Ltd) at the conference; reach her at ada@engines.example."
ENRICH_PROMPTS = [
    "company: Juniper Tiles, city: Porto, employees: 42",
    "company: Okra Logistics, city: Ghent, employees: 1800",
    "company: Pine & Vale, city: Leeds, employees: 7",
]
_PROBLEMS = re.compile(r"Problems: (.*?)\. Reply with", re.DOTALL)


class NoWorker(Exception):
    """Nothing picked the turn up: real-Redis mode with no `stepq worker` running."""


class Tour:
    def __init__(self, client: Client, out: TextIO, embedded: bool) -> None:
        self.client = client
        self.out = out
        self.embedded = embedded
        self.view = LiveView(out, indent="    ")
        self.s = self.view.style

    def say(self, text: str = "") -> None:
        self.view.close_inline()
        self.out.write(f"{text}\n")
        self.out.flush()

    def follow(self, turn_id: str) -> None:
        """Narrate the turn's events; in real-Redis mode, give up when no worker starts it within NO_WORKER_S."""
        cursor = 0
        while True:
            try:
                timeout = None if self.embedded else NO_WORKER_S
                for event in self.client.events(turn_id, after=cursor, idle_timeout=timeout):
                    cursor = event.seq
                    if event.type != EventType.TURN_START:
                        self.on_event(event)
                return
            except TimeoutError:
                if self.client.get(turn_id).status == TurnStatus.QUEUED:
                    raise NoWorker(turn_id) from None

    def on_event(self, event: Event) -> None:
        self.view.on_event(event)

    def note(self, text: str) -> None:
        self.view.line(self.s.dim(f"  ({text})"))

    def finish(self, result: TurnResult, answer: bool) -> None:
        self.say()
        for line in result_lines(result, self.s, answer=answer):
            self.say(f"    {line}")


class SupportTour(Tour):
    """Part 1: streamed text, a read tool, an approval-gated write, the resumed loop."""

    def on_event(self, event: Event) -> None:
        self.view.on_event(event)
        if event.type == EventType.TOOL_CALL and event.data.get("name") == "lookup_order":
            self.note("a read-only tool: the worker runs it right away and feeds the result back to the model")
        elif event.type == EventType.APPROVAL_REQUEST:
            self.approve(event)
        elif event.type == EventType.STEP_START and event.step == 2:
            self.note("the approved refund ran exactly once; its result went back to the model for the final step")

    def approve(self, event: Event) -> None:
        d = event.data
        s = self.s
        self.view.line()
        self.view.line(f"  {s.yellow('The turn is parked.')} issue_refund is a write, so it waits for a person.")
        self.view.line("  The turn sits in Redis holding no worker thread until someone decides.")
        self.view.line(f"    approval id  {d['approval_id']}")
        self.view.line(f"    tool         {d['tool']}")
        self.view.line(f"    args         {compact(d['args'])}")
        record = self.client.runtime.approvals.get(str(d["approval_id"]))
        token = record.token if record is not None else ""
        self.view.line(f"    token        {token_hint(token)}  kept in Redis with the approval, never in an event;")
        self.view.line("                 signed (HMAC-SHA256 over the approval id, turn, tool call, tool name,")
        self.view.line("                 SHA-256 of the args and the expiry)")
        self.view.line(f"  The demo approves it as reviewer {s.bold('demo')}, the way a UI would call Client.approve:")
        receipt = self.client.approve(str(d["approval_id"]), True, reason="damaged on arrival", reviewer="demo")
        receipt.wait(timeout=30.0)
        self.view.line(f"  {s.green('accepted:')} the approve task checked the signature, recorded the decision once,")
        self.view.line("  and re-enqueued the parked step. The loop resumes:")
        self.view.line()


class ExtractTour(Tour):
    """Part 2: object mode. The first answer misses a required field; the repair step fixes it."""

    def on_event(self, event: Event) -> None:
        if event.type == EventType.STEP_START and event.step > 0:
            self.explain_repair(event)
        self.view.on_event(event)

    def explain_repair(self, event: Event) -> None:
        state = self.client.get(event.turn_id)
        notes = [m for m in state.messages if isinstance(m, UserMessage)][1:]
        if not notes:
            return
        found = _PROBLEMS.search(notes[-1].content)
        problems = found.group(1) if found else notes[-1].content[:160]
        self.view.line(self.s.red(f"✗ that answer does not match the Contact schema: {problems}"))
        self.view.line(
            self.s.dim("  (repair step: the worker sends the problems and the schema back to the model, once)")
        )


def run_demo(settings: Settings | None = None, out: TextIO | None = None) -> int:
    settings = with_demo_agents(settings or load_settings())
    out = out or sys.stdout
    worker: AbstractContextManager[None] = local_worker(settings) if settings.embedded else nullcontext()
    with worker:
        try:
            with Client(settings) as client:  # closing it releases the embedded worker its submits share
                return _tour(client, out, settings)
        except NoWorker as exc:
            print(
                f"\nstepq demo: no worker picked up turn {exc} within {NO_WORKER_S:.0f} s.\n"
                "With STEPQ_REDIS_URL set the demo needs a worker started separately, with the demo agents loaded:\n"
                "    STEPQ_AGENT_MODULES=stepq.agents.demo stepq worker\n"
                "(same STEPQ_REDIS_URL, STEPQ_KEY_PREFIX and STEPQ_QUEUE). Or unset STEPQ_REDIS_URL for the "
                "embedded demo.",
                file=sys.stderr,
            )
            return 1


def _tour(client: Client, out: TextIO, settings: Settings) -> int:
    embedded = settings.embedded
    intro = Tour(client, out, embedded)
    s = intro.s
    intro.say(s.bold("stepq demo") + " · durable LLM agent loops on Celery workers with Redis")
    if embedded:
        intro.say("Running embedded: no services, no API keys. This one process holds a Redis stand-in (fakeredis),")
        intro.say("Celery's in-memory broker, a 4-thread Celery worker, and offline models (no keys, no network).")
    else:
        intro.say(f"Running against real Redis (key prefix {settings.key_prefix!r}, queue {settings.queue!r});")
        intro.say("a separately started `stepq worker` runs the steps.")
    intro.say("Each model step (one model call plus the tools it asks for) runs as one Celery task, run_step.")
    intro.say()

    support = SupportTour(client, out, embedded)
    support.say(s.bold("1. A support chat turn: streamed text, a tool call, an approval"))
    support.say(f"   Client.submit('demo.support', prompt={SUPPORT_PROMPT!r})")
    handle = client.submit("demo.support", prompt=SUPPORT_PROMPT)
    support.say(f"   → turn {handle.turn_id}, queued. Its events, as the worker publishes them:")
    support.follow(handle.turn_id)
    first = client.wait(handle.turn_id, timeout=60.0)
    support.finish(first, answer=False)
    support.say()

    extract = ExtractTour(client, out, embedded)
    extract.say(s.bold("2. Object mode: free text in, one schema-valid JSON object out"))
    extract.say("   demo.extractor must answer with a Contact {name, email, company?}; no chat UI involved.")
    extract.say(f"   Client.submit('demo.extractor', prompt={EXTRACT_PROMPT!r})")
    handle = client.submit("demo.extractor", prompt=EXTRACT_PROMPT)
    extract.say(f"   → turn {handle.turn_id}. The model streams its answer:")
    extract.follow(handle.turn_id)
    second = client.wait(handle.turn_id, timeout=60.0)
    extract.finish(second, answer=False)
    if second.object is not None:
        extract.say(f"    {s.bold('TurnResult.object')}, parsed and validated against Contact:")
        for line in pretty(second.object).splitlines():
            extract.say(f"    {line}")
    extract.say()

    enrich = Tour(client, out, embedded)
    enrich.say(s.bold("3. A prompt-aware offline model: three lead lines in, three different objects out"))
    enrich.say("   demo.enricher's offline model copies each line's fields; the segment follows the head count.")
    handles = [client.submit("demo.enricher", prompt=p) for p in ENRICH_PROMPTS]
    enriched = [client.wait(h.turn_id, timeout=60.0) for h in handles]
    for prompt, result in zip(ENRICH_PROMPTS, enriched, strict=True):
        enrich.say(f"   {prompt!r}")
        enrich.say(f"     → {compact(result.object) if result.object is not None else result.error}")
    enrich.say()

    _what_next(intro, embedded)
    ok = first.status == TurnStatus.COMPLETED and second.status == TurnStatus.COMPLETED
    ok = ok and all(r.status == TurnStatus.COMPLETED for r in enriched)
    return 0 if ok else 1


def _what_next(tour: Tour, embedded: bool) -> None:
    s = tour.s
    tour.say(s.bold("What next"))
    if embedded:
        tour.say("  • Run it for real, with state and queues in Redis and as many workers as you like:")
        tour.say("        export STEPQ_REDIS_URL=redis://127.0.0.1:6379/0")
        tour.say("        export STEPQ_APPROVAL_SECRET=$(openssl rand -hex 32)   # signs approval tokens")
        tour.say("        export STEPQ_AGENT_MODULES=stepq.agents.demo          # your agent modules, comma-separated")
        tour.say("        stepq worker                                           # in one terminal (or ten)")
        tour.say('        stepq run demo.support "Refund order A-1001, please"   # you approve at the prompt')
    else:
        tour.say('  • stepq run demo.support "Refund order A-1001"  decides approvals at the terminal;')
        tour.say("    stepq show TURN / stepq events TURN inspect any turn.")
    tour.say("  • Write an agent (a @tool and an AgentDefinition): docs/guides/writing-agents.md.")
    tour.say("  • make test runs the suite against real Redis and real Celery workers.")
