"""The agent of `bench.provider_batch`: one enrichment step on the scripted model, with fixed token counts
and a simulated model latency (BENCH_PB_LATENCY_S, spread over the answer's deltas)."""

from __future__ import annotations

import os

from stepq.agents.definition import AgentDefinition
from stepq.providers.scripted import ScriptStep

TEXT = "enriched"
LATENCY_S = float(os.environ.get("BENCH_PB_LATENCY_S", "0.5"))  # an online call's simulated model latency
DELTA_CHARS = 1  # one delta per character: the latency is spread over len(TEXT) deltas

enrich = AgentDefinition(
    id="benchpb.enrich",
    system_prompt="Enrich the record.",
    default_provider="scripted",
    default_model="bench-sonnet",
    priority="batch",
    script=[
        ScriptStep(
            text=TEXT,
            delta_chars=DELTA_CHARS,
            delta_delay_s=LATENCY_S / len(TEXT),
            input_tokens=1200,
            output_tokens=300,
        )
    ],
)
