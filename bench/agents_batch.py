"""Agents for the batch benchmarks (`bench.batch_throughput`, `bench.chat_under_batch`), all on the scripted model.

`benchb.extract`: object mode, zero latency. It has no tools, so its one step is the answer step:
the model answers through the forced output tool and the worker validates the object. One item =
one step + validation.
`benchb.chat`: an interactive turn that streams its answer in several text deltas.
`benchb.batch_item`: a batch-priority turn whose single step takes a short simulated model time.
"""

from __future__ import annotations

from pydantic import BaseModel

from stepq.agents.definition import AgentDefinition
from stepq.providers.scripted import ScriptStep

EXTRACTED = {"name": "Ada Lovelace", "email": "ada@example.com", "score": 7}


class Extracted(BaseModel):
    name: str
    email: str
    score: int


extract = AgentDefinition(
    id="benchb.extract",
    system_prompt="Extract the contact as JSON.",
    execution_mode="object",
    output=Extracted,
    priority="batch",
    script=[ScriptStep(object=EXTRACTED)],
)

CHAT_TEXT = "Sure: your order A-1001 shipped today and should arrive on Friday."

chat = AgentDefinition(
    id="benchb.chat",
    system_prompt="You are a support agent.",
    script=[ScriptStep(text=CHAT_TEXT, delta_chars=8, delta_delay_s=0.002)],  # 9 deltas, ~20 ms of streaming
)

batch_item = AgentDefinition(
    id="benchb.batch_item",
    system_prompt="Summarise in one word.",
    priority="batch",
    script=[ScriptStep(text="done-ok", delta_chars=4, delta_delay_s=0.005)],  # 2 deltas, ~10 ms of model time
)
