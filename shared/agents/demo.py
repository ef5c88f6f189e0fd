"""The bundled demo agents, offline (no keys, no network): a support agent with a read tool and an
approval-gated refund, a planner whose date picker runs at the caller (a client-side tool), an object-mode
extractor, a batch enricher and a storyteller that streams slowly.

The support agent, the enricher and the storyteller run on `FunctionModel`s that read what they are told:
the order the prompt names, what `lookup_order` found, whether the refund was approved; the fields of a lead
line. So a newcomer sees the real behaviour of the loop (a denied refund is not "on its way", an input the
schema refuses fails its turn) rather than a replay.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field

from stepq.agents.definition import AgentDefinition, LoopConfig
from stepq.agents.extensions import Suggestion
from stepq.agents.tools import ToolContext, tool
from stepq.models import Message, ToolResult, ToolResultMessage, UserMessage
from stepq.providers.function import FunctionModel, FunctionRequest, FunctionResponse
from stepq.providers.scripted import ScriptStep, ScriptToolCall

ORDERS = {
    "A-1001": {"order_id": "A-1001", "item": "espresso grinder", "amount_eur": 129.0, "status": "delivered damaged"},
    "A-1002": {"order_id": "A-1002", "item": "milk frother", "amount_eur": 39.5, "status": "in transit"},
}
REFUNDS: list[dict[str, object]] = []


@tool
def lookup_order(order_id: str) -> dict[str, object]:
    """Look up an order by id: item, amount and delivery status."""
    order = ORDERS.get(order_id)
    if order is None:
        raise ValueError(f"no order {order_id}")
    return order


@tool(is_mutation=True)
def issue_refund(order_id: str, amount_eur: float, ctx: ToolContext) -> dict[str, object]:
    """Refund an order (a write: needs a person's approval)."""
    refund = {"order_id": order_id, "amount_eur": amount_eur, "refund_id": f"R-{ctx.idempotency_key[-8:]}"}
    REFUNDS.append(refund)
    return refund


_ORDER_ID = re.compile(r"\b[A-Z]-\d{1,8}\b", re.IGNORECASE)
_WANTS_REFUND = re.compile(r"refund|money back|reimburs|broke|damaged|faulty", re.IGNORECASE)
ASK_FOR_ORDER = "Which order is it about? Tell me its id (it looks like A-1001) and I will look it up."
REFUND_DONE = "Done: the refund is on its way. Anything else I can help with?"


def _since_last_prompt(messages: list[Message]) -> tuple[str, list[ToolResult]]:
    """The latest user message (a chat thread asks one thing at a time) and the tool results after it."""
    last = max((i for i, m in enumerate(messages) if isinstance(m, UserMessage)), default=-1)
    asked = messages[last] if last >= 0 else None
    prompt = asked.content if isinstance(asked, UserMessage) else ""
    results = [r for m in messages[last + 1 :] if isinstance(m, ToolResultMessage) for r in m.results]
    return str(prompt), results


def _order_named(prompt: str) -> str | None:
    """The order id the customer gives, else the order of an item they name ("my grinder")."""
    found = _ORDER_ID.search(prompt)
    if found:
        return found.group(0).upper()
    words = set(re.findall(r"[a-z]+", prompt.lower()))
    return next((oid for oid, order in ORDERS.items() if set(str(order["item"]).split()) & words), None)


def _error_of(result: ToolResult) -> str:
    output = result.output
    return str(output.get("error", output)) if isinstance(output, dict) else str(output)


def _after_lookup(prompt: str, result: ToolResult) -> FunctionResponse | str:
    order = result.output
    if result.is_error or not isinstance(order, dict):
        return f"I could not find that order ({_error_of(result)}). Please check the id."
    oid, item, amount, status = order["order_id"], order["item"], float(order["amount_eur"]), order["status"]
    if not _WANTS_REFUND.search(prompt):
        return f"Order {oid}: the {item} ({amount:.2f} EUR) is {status}."
    if "damaged" not in str(status):
        return f"Order {oid}: the {item} is {status}, not damaged, so there is nothing to refund yet."
    return FunctionResponse(
        text=f"The {item} arrived damaged, so I am proposing a full refund of {amount:.2f} EUR.",
        tool_calls=[ScriptToolCall(name="issue_refund", args={"order_id": oid, "amount_eur": amount})],
    )


def _after_refund(result: ToolResult) -> str:
    if result.is_error:  # denied by the reviewer, expired, or failed: nothing was refunded
        return f"No refund was issued ({_error_of(result)}). Anything else I can help with?"
    return REFUND_DONE


def support_model(request: FunctionRequest) -> FunctionResponse | str:
    """Look up the order the customer names, propose a refund for a damaged one, report what came of it."""
    prompt, results = _since_last_prompt(request.messages)
    done = {r.name: r for r in results}
    if "issue_refund" in done:
        return _after_refund(done["issue_refund"])
    if "lookup_order" in done:
        return _after_lookup(prompt, done["lookup_order"])
    order_id = _order_named(prompt)
    if order_id is None:
        return ASK_FOR_ORDER
    return FunctionResponse(
        text="Let me look that order up.",
        tool_calls=[ScriptToolCall(name="lookup_order", args={"order_id": order_id})],
    )


support = AgentDefinition(
    id="demo.support",
    description="Answers order questions and proposes refunds.",
    system_prompt="You are a support agent. Look orders up before acting; refunds need approval.",
    allowed_tools=["lookup_order", "issue_refund"],
    read_only=False,
    mutation_policy="confirm-required",
    loop=LoopConfig(max_steps=6),
    suggestions=[
        Suggestion(label="Refund a damaged order", prompt="My order A-1001 arrived damaged, can I get a refund?"),
        Suggestion(label="Where is order A-1002?"),
    ],
    function_model=FunctionModel(support_model),
)


@tool(client=True)
def pick_date(question: str) -> str:
    """Ask the user to pick a date (a client-side tool: it runs in the caller's UI, never on a worker)."""
    raise RuntimeError("pick_date runs at the caller")


planner = AgentDefinition(
    id="demo.planner",
    description="Books a table; asks the user for the date through a client-side tool.",
    system_prompt="You book tables. Ask the user for the date with pick_date.",
    allowed_tools=["pick_date"],
    script=[
        ScriptStep(
            text="Let me ask you for a date.",
            tool_calls=[ScriptToolCall(name="pick_date", args={"question": "Which evening suits you?"})],
        ),
        ScriptStep(text="Booked: a table for two on the date you picked."),
    ],
)


class Contact(BaseModel):
    name: str = Field(description="Full name")
    email: str
    company: str | None = None


extractor = AgentDefinition(
    id="demo.extractor",
    description="Extracts a contact card from free text, a business card photo or a PDF (object mode).",
    system_prompt="Extract the contact as JSON.",
    execution_mode="object",
    output=Contact,
    accepted_media_types=["image/*", "application/pdf", "text/plain"],
    script=[
        ScriptStep(object={"name": "Ada Lovelace", "company": "Analytical Engines Ltd"}),  # missing email
        ScriptStep(
            object={"name": "Ada Lovelace", "email": "ada@engines.example", "company": "Analytical Engines Ltd"}
        ),
    ],
)


@tool
def company_domain(company: str) -> dict[str, str]:
    """The web domain a company is known by (offline: derived from its name)."""
    slug = "".join(ch for ch in company.lower() if ch.isalnum()) or "unknown"
    return {"company": company, "domain": f"{slug}.example"}


class Lead(BaseModel):
    company: str
    city: str
    employees: int = Field(ge=1)
    segment: Literal["smb", "mid-market", "enterprise"]


_LEAD_FIELD = re.compile(r"(?i)\b(company|city|employees)\s*[:=]\s*([^,;\n]+)")


def segment_of(employees: int) -> Literal["smb", "mid-market", "enterprise"]:
    """The sales segment by head count: under 100 small, under 1000 mid-market, else enterprise."""
    return "smb" if employees < 100 else "mid-market" if employees < 1000 else "enterprise"


def _lead_fields(item: str) -> dict[str, Any]:
    """The `name: value` pairs of a lead line, exactly as given (a missing one stays missing)."""
    fields: dict[str, Any] = {name.lower(): value.strip() for name, value in _LEAD_FIELD.findall(item)}
    if "employees" in fields:
        count = re.search(r"-?\d+", fields["employees"])
        fields["employees"] = int(count.group(0)) if count else fields["employees"]
        if isinstance(fields["employees"], int):
            fields["segment"] = segment_of(fields["employees"])
    return fields


def enricher_model(request: FunctionRequest) -> FunctionResponse:
    """Look the company up once, then answer with the lead line's own fields: nothing invented, so a line the
    schema refuses (`employees: 0`) fails its turn instead of turning into some other lead."""
    item = next((str(m.content) for m in request.messages if isinstance(m, UserMessage)), "")
    fields = _lead_fields(item)
    if "company" in fields and "company_domain" not in request.called and not request.answer_now:
        return FunctionResponse(tool_calls=[ScriptToolCall(name="company_domain", args={"company": fields["company"]})])
    return FunctionResponse(object=fields)


enricher = AgentDefinition(
    id="demo.enricher",
    description="Enriches a lead line (company, city, employees) into a Lead object (object mode, batch).",
    system_prompt="Look the company up, then answer with the lead as JSON.",
    execution_mode="object",
    output=Lead,
    allowed_tools=["company_domain"],
    loop=LoopConfig(max_steps=4),
    function_model=FunctionModel(enricher_model),
)


STORY_DELAY_S = 0.15  # between deltas: about ten seconds of text, long enough to reload a page mid-answer


def storyteller_model(request: FunctionRequest) -> FunctionResponse:
    """A long answer about the prompt's subject, streamed slowly."""
    prompt, _ = _since_last_prompt(request.messages)
    asked = " ".join(prompt.split())
    about = re.search(r"(?i)\babout\s+(.+)", asked)
    subject = ((about.group(1) if about else asked).rstrip(".!?") or "a queue that never loses a step")[:80]
    lines = [
        f"Here is a slow story about {subject}.",
        "Every few words arrive as their own event, stored in Redis before you see them.",
        "Reload the chat page now, or stop `stepq events` with Ctrl-C and start it again:",
        "the page reconnects and the command resumes after the last event it printed,",
        "so nothing is lost and nothing is shown twice.",
        "The worker writing this does not know or care who is reading;",
        "it appends each delta to the turn's event log and moves on.",
        "A reader is just a cursor into that log: the sequence number of the last event it saw.",
        f"And that is the end of the story about {subject}.",
    ]
    return FunctionResponse(text=" ".join(lines), delta_delay_s=STORY_DELAY_S)


storyteller = AgentDefinition(
    id="demo.storyteller",
    description="Streams a long answer slowly (about ten seconds): reload the page or restart `stepq events` "
    "mid-answer to see it resume where it left off.",
    system_prompt="Tell a story about what the user asks for.",
    suggestions=[Suggestion(label="Tell me a story about a durable agent loop")],
    function_model=FunctionModel(storyteller_model),
)
