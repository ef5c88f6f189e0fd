// A turn's step timeline: its events (as they stream) folded into one entry per step, joined with the
// step's trace row (GET /v1/turns/{id}/trace: attempts, failovers, usage, cost, duration, stop reason).

import { el, money, seconds, when } from './views.js';

const TURN_WIDE = new Set(['turn-start', 'plan-update', 'context-compacted', 'tool-results-request', 'step-batched']);

/** Folds events into steps: {step, model, attempts: [...], tools: Map, approvals: [...], text, reasoning}. */
export class Timeline {
  constructor() {
    this.steps = new Map();
    this.finish = null;
    this.errors = [];
  }

  step(n) {
    if (!this.steps.has(n)) {
      this.steps.set(n, { step: n, starts: [], retries: [], tools: new Map(), approvals: [], text: '', reasoning: '', finished: null, resets: 0 });
    }
    return this.steps.get(n);
  }

  apply(event) {
    const d = event.data || {};
    if (event.type === 'turn-finish') {
      this.finish = { status: d.status, reason: d.finish_reason, at: event.ts };
      return;
    }
    if (TURN_WIDE.has(event.type)) return;
    const s = this.step(event.step);
    switch (event.type) {
      case 'step-start':
        s.starts.push({ provider: d.provider, model: d.model, at: event.ts });
        break;
      case 'text-delta':
        s.text += d.delta || d.text || '';
        break;
      case 'reasoning-delta':
        s.reasoning += d.delta || d.text || '';
        break;
      case 'step-reset':
        s.text = '';
        s.reasoning = '';
        s.resets += 1;
        break;
      case 'step-retry':
        s.retries.push({ attempt: d.attempt, error: d.error || d.reason || d.code || '', countdown: d.countdown, at: event.ts });
        break;
      case 'tool-call':
        s.tools.set(d.id, { id: d.id, name: d.name, args: d.args, calledAt: event.ts });
        break;
      case 'tool-result': {
        const call = s.tools.get(d.id) || { id: d.id, name: d.name };
        Object.assign(call, { status: d.status, isError: d.is_error, output: d.output, doneAt: event.ts });
        s.tools.set(d.id, call);
        break;
      }
      case 'approval-request':
        s.approvals.push({ id: d.approval_id, callId: d.tool_call_id, tool: d.tool_name || d.tool, at: event.ts });
        break;
      case 'approval-decision': {
        const known = s.approvals.find((a) => a.id === d.approval_id);
        const decision = { decision: d.decision, reviewer: d.reviewer, reason: d.reason, decidedAt: event.ts };
        if (known) Object.assign(known, decision);
        else s.approvals.push({ id: d.approval_id, callId: d.tool_call_id, ...decision });
        break;
      }
      case 'step-finish':
        s.finished = { usage: d.usage, reason: d.finish_reason, at: event.ts };
        break;
      case 'error':
        this.errors.push(d.message || d.error || JSON.stringify(d));
        break;
      default:
        break;
    }
  }
}

function tokens(usage) {
  if (!usage) return '';
  const input = usage.input_tokens ?? 0;
  const output = usage.output_tokens ?? 0;
  return `${input} in / ${output} out tokens`;
}

/** A tool call: its duration as the step's trace measured it around the function (the events' times only
 * while the step runs, before its trace row exists). */
function drawTool(call, traced) {
  const measured = traced?.duration_s;
  const fromEvents = call.doneAt !== undefined && call.calledAt !== undefined ? seconds(call.doneAt - call.calledAt) : 'running';
  const duration = measured != null ? seconds(measured) : fromEvents;
  const status = call.status ? call.status.replaceAll('_', ' ') : 'running';
  const attrs = { class: `entry tool${call.isError ? ' error' : ''}`, testid: 'tl-tool', 'data-tool': call.name };
  if (measured != null) attrs['data-duration'] = String(measured);
  return el('div', attrs,
    el('div', {}, el('strong', {}, call.name || call.id), ` — ${status}`, el('span', { class: 'meta' }, ` · ${duration}`)),
    call.args !== undefined ? el('div', { class: 'mono' }, JSON.stringify(call.args)) : null,
    call.output !== undefined ? el('div', { class: 'mono meta' }, `→ ${truncate(JSON.stringify(call.output), 300)}`) : null);
}

const truncate = (text, n) => (text && text.length > n ? `${text.slice(0, n)}…` : text);

function drawApproval(a) {
  const decided = a.decision ? `${a.decision}${a.reviewer ? ` by ${a.reviewer}` : ''} ${when(a.decidedAt)}${a.reason ? ` (${a.reason})` : ''}` : 'waiting for a reviewer';
  return el('div', { class: 'entry approval', testid: 'tl-approval', 'data-decision': a.decision || 'pending' },
    `approval ${a.tool ? `of ${a.tool} ` : ''}— ${decided}`);
}

/** One list item per step: what the trace says of it, then what its events showed. */
export function drawTimeline(timeline, traceSteps) {
  const byStep = new Map((traceSteps || []).map((t) => [t.step, t]));
  const numbers = [...new Set([...timeline.steps.keys(), ...byStep.keys()])].sort((a, b) => a - b);
  const list = el('ol', { class: 'timeline', testid: 'timeline' });
  for (const n of numbers) {
    const s = timeline.step(n);
    const t = byStep.get(n);
    const start = s.starts.at(-1);
    const model = t ? `${t.provider}/${t.model}` : start ? `${start.provider}/${start.model}` : '';
    const item = el('li', { testid: 'tl-step', 'data-step': String(n) },
      el('div', { class: 'step-head' },
        el('span', { class: 'title' }, `Step ${n + 1}${t?.kind === 'compaction' ? ' (compaction)' : ''}`),
        el('span', { class: 'mono' }, model),
        t ? el('span', { class: 'meta', testid: 'tl-usage' }, tokens(t.usage)) : s.finished ? el('span', { class: 'meta' }, tokens(s.finished.usage)) : null,
        t ? el('span', { class: 'meta', testid: 'tl-cost' }, t.cost == null ? 'cost: no price' : `cost ${money(t.cost)}`) : null,
        t ? el('span', { class: 'meta' }, `model call ${seconds(t.duration_s)}`) : null,
        t?.stop_reason ? el('span', { class: 'meta' }, `stopped: ${t.stop_reason}`) : null));
    for (const failed of t?.failed_attempts || []) {
      const who = failed.provider ? ` on ${failed.provider}/${failed.model}` : '';
      item.append(el('div', { class: `entry ${failed.provider ? 'failover' : 'retry'}`, testid: 'tl-attempt' },
        `attempt ${failed.attempt + 1} failed${who}: ${failed.error || 'error'} (${tokens(failed.usage)}${failed.cost != null ? `, ${money(failed.cost)}` : ''})`));
    }
    for (const r of s.retries) {
      item.append(el('div', { class: 'entry retry', testid: 'tl-retry' }, `retry (attempt ${(r.attempt ?? 0) + 1}): ${r.error}`));
    }
    if (t?.retries && !s.retries.length) item.append(el('div', { class: 'entry retry' }, `${t.retries} retr${t.retries === 1 ? 'y' : 'ies'}`));
    if (s.starts.length > 1) {
      item.append(el('div', { class: 'entry failover', testid: 'tl-failover' },
        `model calls: ${s.starts.map((x) => `${x.provider}/${x.model}`).join(' → ')}`));
    }
    const traced = new Map((t?.calls || []).map((c) => [c.id, c]));
    for (const call of s.tools.values()) item.append(drawTool(call, traced.get(call.id)));
    for (const a of s.approvals) item.append(drawApproval(a));
    if (s.reasoning) item.append(el('details', {}, el('summary', {}, 'reasoning'), el('div', { class: 'streamed' }, s.reasoning)));
    if (s.text) item.append(el('div', { class: 'streamed', testid: 'tl-text' }, s.text));
    list.append(item);
  }
  return list;
}
