"""The bundled demo agents: a support agent with a read tool and an approval-gated refund, a planner
whose date picker runs at the caller (a client-side tool), and an object-mode extractor, on the offline `scripted` provider; and a batch enricher on the
offline `TestModel`, whose tool arguments and objects follow each item's text.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from stepq.agents import AgentDefinition, LoopConfig
from stepq.extensions import Suggestion
from stepq.providers.function import TestModel
from stepq.providers.scripted import ScriptStep, ScriptToolCall
from stepq.tools import ToolContext, tool

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
    script=[
        ScriptStep(
            text="Let me look that order up.",
            tool_calls=[ScriptToolCall(name="lookup_order", args={"order_id": "A-1001"})],
        ),
        ScriptStep(
            text="The grinder arrived damaged, so I am proposing a full refund of 129.00 EUR.",
            tool_calls=[ScriptToolCall(name="issue_refund", args={"order_id": "A-1001", "amount_eur": 129.0})],
        ),
        ScriptStep(text="Done: the refund is on its way. Anything else I can help with?"),
    ],
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


enricher = AgentDefinition(
    id="demo.enricher",
    description="Enriches a lead line (company, city, employees) into a Lead object (object mode, batch).",
    system_prompt="Look the company up, then answer with the lead as JSON.",
    execution_mode="object",
    output=Lead,
    allowed_tools=["company_domain"],
    loop=LoopConfig(max_steps=4),
    function_model=TestModel(),  # offline: `name: value` pairs in the item's text become the fields
)
