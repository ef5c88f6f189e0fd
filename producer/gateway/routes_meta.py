"""Agents, health, readiness and metrics."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from stepq.producer.agent_card import picker_fields
from stepq.producer.gateway.auth import Principal, require
from stepq.producer.gateway.routes_turns import gateway
from stepq.producer.gateway.service import Gateway

router = APIRouter(tags=["meta"])


@router.get("/v1/agents")
async def agents(
    gw: Annotated[Gateway, Depends(gateway)], principal: Annotated[Principal, Depends(require("read"))]
) -> dict[str, Any]:
    """Every agent this gateway can submit to: id, description, mode, tools, whether approvals may be needed, the
    starter prompts (`suggestions`) a chat launcher offers, and for a picker or a router the label, keywords,
    domain, data capabilities and the models the agent may run under STEPQ_POLICY and this credential's policy."""
    registry = gw.runtime.agents
    out = []
    for agent_id in registry.ids():
        agent = registry.get(agent_id)
        if agent is None:
            continue
        tools = agent.visible_tools()
        may_need_approval = any(
            callable(t.needs_approval) or t.needs_approval or agent.call_needs_approval(t, {}) for t in tools
        )
        out.append(
            {
                "id": agent.id,
                "description": agent.description,
                "execution_mode": agent.execution_mode,
                "tools": [t.name for t in tools],
                "approvals_possible": bool(may_need_approval),
                "suggestions": [s.model_dump() for s in agent.suggestions],
                **picker_fields(agent, gw.settings, principal.policy),
            }
        )
    return {"agents": out}


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up and serving."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(gw: Annotated[Gateway, Depends(gateway)]) -> dict[str, str]:
    """Ready when Redis answers (the gateway can store, enqueue and stream); what it finds, every request sees."""
    await gw.health.probe()
    gw.health.refuse_while_down()
    return {"status": "ready"}


@router.get("/metrics", response_class=Response)
async def metrics(gw: Annotated[Gateway, Depends(gateway)]) -> Response:
    """Prometheus text: open streams, requests by route and status, stream durations."""
    gw.metrics.subscribed_channels.set(gw.hub.subscribed_channels)
    return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)
