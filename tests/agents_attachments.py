"""Agents for the attachment tests: one per provider (the wire fakes play the model), one that accepts
no files, and a scripted five-step agent that reads a PDF (for the stored-once measurement)."""

from __future__ import annotations

from stepq.agents.definition import AgentDefinition, LoopConfig
from stepq.agents.tools import tool
from stepq.providers.scripted import ScriptStep, ScriptToolCall
from tests.agents_bedrock import BEDROCK_MODEL

FILES = ["image/*", "application/pdf", "text/plain"]


@tool
def att_note(page: int) -> str:
    """Note a page of the document."""
    return f"noted page {page}"


anthropic = AgentDefinition(
    id="attach_t.anthropic", default_provider="anthropic", default_model="claude-test", accepted_media_types=FILES
)
gemini = AgentDefinition(
    id="attach_t.gemini", default_provider="gemini", default_model="gemini-test", accepted_media_types=FILES
)
bedrock = AgentDefinition(
    id="attach_t.bedrock", default_provider="bedrock", default_model=BEDROCK_MODEL, accepted_media_types=FILES
)
images_only = AgentDefinition(
    id="attach_t.images_only",
    default_provider="scripted",
    accepted_media_types=["image/png"],
    script=[ScriptStep(echo_messages=True)],  # "saw: user:<text> [image/png, N bytes]": what the worker sent
)
text_only = AgentDefinition(id="attach_t.text_only", default_provider="scripted", script=[ScriptStep(text="no files")])


def _reader(agent_id: str, media_type: str, pages: int, last: ScriptStep) -> AgentDefinition:
    """A scripted agent that notes `pages` pages (one `att_note` call a step), then answers with `last`."""
    return AgentDefinition(
        id=agent_id,
        default_provider="scripted",
        accepted_media_types=[media_type],
        allowed_tools=["att_note"],
        loop=LoopConfig(max_steps=pages + 1),
        script=[
            *(ScriptStep(tool_calls=[ScriptToolCall(name="att_note", args={"page": n})], fresh_call_ids=True)
              for n in range(1, pages + 1)),
            last,
        ],
    )  # fmt: skip


reader = _reader("attach_t.reader", "application/pdf", 4, ScriptStep(text="read it"))
# the third step's request, echoed: "saw: user:<text> [image/png, N bytes] | ...": what the worker sent
rereader = _reader("attach_t.rereader", "image/png", 2, ScriptStep(echo_messages=True))
