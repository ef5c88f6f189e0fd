"""Agents for the rate-limit, priority and batch tests."""

from __future__ import annotations

from shared.agents import AgentDefinition
from shared.providers.scripted import ScriptFailure, ScriptStep
from shared.ratelimit import RateLimit

limited = AgentDefinition(
    id="bt.limited",
    rate_limit=RateLimit(rpm=3, window_s=2.0),
    script=[ScriptStep(text="ok")],
)

throttled = AgentDefinition(
    id="bt.throttled",
    default_model="throttled-model",
    rate_limit=RateLimit(rpm=100, penalty_factor=0.5, penalty_s=30),
    script=[ScriptStep(text="ok", fail=ScriptFailure(when="before", status=429, retry_after_s=5.0))],
)

same_model = AgentDefinition(
    id="bt.same_model",
    default_model="throttled-model",
    rate_limit=RateLimit(rpm=100),
    script=[ScriptStep(text="ok")],
)

one_at_a_time = AgentDefinition(
    id="bt.one_at_a_time",
    default_model="solo-model",
    rate_limit=RateLimit(concurrency=1),
    script=[ScriptStep(text="ok")],
)

chat = AgentDefinition(id="bt.chat", script=[ScriptStep(text="hello there", delta_chars=4)])

batch_item = AgentDefinition(
    id="bt.batch_item",
    priority="batch",
    script=[ScriptStep(text="0123456789", delta_chars=5, delta_delay_s=0.05)],
)
