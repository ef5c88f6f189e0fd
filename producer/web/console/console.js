// The operator console at /console: turns (filtered, live), a turn's step timeline with cancel and fork,
// the approval inbox (decided as the signed-in principal), batches with progress. Plain ES modules over
// the gateway's own routes; live parts follow the turns' SSE event streams.

import { followEvents, getJson, HttpError, postJson, request, errorText } from './api.js';
import { drawTimeline, Timeline } from './timeline.js';
import { argsList, el, statusBadge, TERMINAL, turnLink, when } from './views.js';
import { markdown } from '/ui/markdown.js';

const $ = (id) => document.getElementById(id);
const view = () => $('view');
let leave = () => {}; // the current view's clean-up (timers, open streams)

function setBanner(text) {
  $('banner').hidden = !text;
  $('banner').textContent = text;
}

/** Runs a view action; a refusal or a lost connection is shown in the banner instead of thrown. */
async function guarded(action) {
  try {
    setBanner('');
    return await action();
  } catch (error) {
    if (error.name === 'AbortError') return undefined;
    setBanner(error instanceof HttpError ? error.message : `connection problem: ${error.message}`);
    return undefined;
  }
}

/** Calls `fn` now and every `ms` while the view is open. */
function every(ms, fn) {
  let timer = null;
  let stopped = false;
  const tick = async () => {
    await fn();
    if (!stopped) timer = setTimeout(tick, ms);
  };
  tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

// ------------------------------------------------------------------ turns

const STATUSES = ['', 'queued', 'running', 'awaiting_approval', 'awaiting_tool_results', 'completed', 'failed', 'cancelled'];

function turnsView(params) {
  const filters = el('form', { class: 'filters', testid: 'turn-filters' });
  const field = (name, label, input) => {
    input.name = name;
    input.value = params.get(name) || '';
    filters.append(el('label', {}, label, input));
  };
  field('status', 'Status', el('select', { testid: 'filter-status' }, ...STATUSES.map((s) => el('option', { value: s }, s ? s.replaceAll('_', ' ') : 'any'))));
  field('agent', 'Agent', el('input', { testid: 'filter-agent', placeholder: 'agent id' }));
  field('thread', 'Thread', el('input', { placeholder: 'thr_…' }));
  field('batch', 'Batch', el('input', { placeholder: 'batch id' }));
  filters.append(el('button', { type: 'submit' }, 'Filter'));
  filters.onsubmit = (event) => {
    event.preventDefault();
    const query = new URLSearchParams([...new FormData(filters)].filter(([, v]) => v));
    location.hash = `#/turns?${query}`;
  };
  const body = el('tbody');
  const more = el('button', { type: 'button', hidden: true, testid: 'more' }, 'Older turns');
  view().replaceChildren(el('h1', {}, 'Turns'), filters,
    el('table', { class: 'list', testid: 'turns' },
      el('thead', {}, el('tr', {}, ...['Turn', 'Agent', 'Status', 'Step', 'Created', 'Updated', 'Finish', 'Thread / batch'].map((h) => el('th', {}, h)))),
      body), more);

  const query = new URLSearchParams([...params].filter(([k, v]) => v && ['status', 'agent', 'thread', 'batch', 'since'].includes(k)));
  let older = []; // pages fetched with "Older turns": kept below the live first page
  let cursor = null;
  const row = (t) => el('tr', { class: 'row', testid: 'turn-row', 'data-turn': t.turn_id },
    el('td', {}, turnLink(t.turn_id), t.origin ? el('div', { class: 'meta' }, `fork of ${t.origin.turn_id} @ step ${t.origin.step + 1}`) : null),
    el('td', {}, t.agent), el('td', {}, statusBadge(t.status)), el('td', {}, String(t.step + 1)),
    el('td', { class: 'meta' }, when(t.created_at)), el('td', { class: 'meta' }, when(t.updated_at)),
    el('td', {}, t.finish_reason || ''), el('td', { class: 'mono meta' }, t.thread_id || t.batch_id || ''));
  const draw = (first) => {
    const items = [...first, ...older];
    body.replaceChildren(...(items.length ? items.map(row) : [el('tr', {}, el('td', { colspan: 8, class: 'empty' }, 'No turns match.'))]));
    more.hidden = !cursor;
  };
  let first = [];
  more.onclick = () => guarded(async () => {
    const page = await getJson(`/v1/turns?${query}&limit=50&cursor=${encodeURIComponent(cursor)}`);
    older = [...older, ...page.items];
    cursor = page.next_cursor;
    draw(first);
  });
  // live status: the first page is listed again every 2 s (one indexed read), older pages stay as fetched
  return every(2000, () => guarded(async () => {
    const page = await getJson(`/v1/turns?${query}&limit=50`);
    first = page.items;
    if (!older.length) cursor = page.next_cursor;
    draw(first);
    document.body.dataset.ready = 'yes';
  }));
}

// ------------------------------------------------------------------ one turn

function facts(turn) {
  const usage = turn.usage || {};
  const rows = [
    ['Status', statusBadge(turn.status)],
    ['Agent', turn.agent],
    ['Model', `${turn.provider}/${turn.model}`],
    ['Steps', String(turn.step + 1)],
    ['Tokens', `${usage.input_tokens ?? 0} in / ${usage.output_tokens ?? 0} out`],
    ['Created', when(turn.created_at)],
    ['Finished', turn.finished_at ? when(turn.finished_at) : '—'],
  ];
  if (turn.metadata?.thread_id) rows.push(['Thread', turn.metadata.thread_id]);
  if (turn.metadata?.batch_id) rows.push(['Batch', turn.metadata.batch_id]);
  if (turn.origin) rows.push(['Forked from', el('span', {}, turnLink(turn.origin.turn_id), ` at step ${turn.origin.step + 1}`)]);
  if (turn.result?.finish_reason) rows.push(['Finish', turn.result.finish_reason]);
  if (turn.result?.error) rows.push(['Error', el('span', { class: 'error' }, turn.result.error)]);
  return el('dl', { class: 'facts', testid: 'turn-facts' }, ...rows.flatMap(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]));
}

function forkForm(turnId, steps) {
  const step = el('select', { name: 'from_step', testid: 'fork-step' }, ...Array.from({ length: steps }, (_, i) => el('option', { value: String(i) }, `step ${i + 1}`)));
  const prompt = el('textarea', { name: 'prompt', rows: 2, placeholder: 'a new last user message (optional)', testid: 'fork-prompt' });
  const model = el('input', { name: 'model', placeholder: 'another model (optional)', testid: 'fork-model' });
  const form = el('form', { class: 'filters', testid: 'fork-form' },
    el('label', {}, 'From', step), el('label', {}, 'Prompt', prompt), el('label', {}, 'Model', model),
    el('button', { type: 'submit', testid: 'fork' }, 'Fork'));
  form.onsubmit = (event) => {
    event.preventDefault();
    guarded(async () => {
      const body = { from_step: Number(step.value) };
      if (prompt.value.trim()) body.prompt = prompt.value.trim();
      if (model.value.trim()) body.model = model.value.trim();
      const forked = await postJson(`/v1/turns/${encodeURIComponent(turnId)}/fork`, body);
      location.hash = `#/turn/${encodeURIComponent(forked.turn_id)}`;
    });
  };
  return form;
}

function turnView(turnId) {
  const abort = new AbortController();
  const timeline = new Timeline();
  const head = el('div', { class: 'card' });
  const actions = el('div', { class: 'actions' });
  const steps = el('div', { testid: 'steps' });
  const result = el('div');
  view().replaceChildren(el('h1', {}, 'Turn ', el('span', { class: 'mono' }, turnId)), head, actions, el('h2', {}, 'Steps'), steps, result);
  let trace = [];
  let turn = null;
  let forkSteps = 0;
  let cancelAsked = false;
  const cancel = el('button', { type: 'button', testid: 'cancel' }, 'Cancel turn');
  cancel.onclick = () => guarded(async () => {
    cancelAsked = cancel.disabled = true;
    const response = await request(`/v1/turns/${encodeURIComponent(turnId)}/cancel`, { method: 'POST' });
    if (!response.ok) {
      cancelAsked = cancel.disabled = false;
      throw new HttpError(await errorText(response));
    }
  });

  const drawSteps = () => steps.replaceChildren(drawTimeline(timeline, trace));
  const refresh = () => guarded(async () => {
    const enc = encodeURIComponent(turnId);
    [turn, { steps: trace }] = await Promise.all([getJson(`/v1/turns/${enc}`), getJson(`/v1/turns/${enc}/trace`)]);
    head.replaceChildren(facts(turn));
    cancel.disabled = cancelAsked || TERMINAL.has(turn.status);
    if (forkSteps !== turn.step + 1) { // a new step to fork from: the form is rebuilt (else it keeps what was typed)
      forkSteps = turn.step + 1;
      actions.replaceChildren(cancel, forkForm(turnId, Math.max(1, forkSteps)));
    }
    const text = turn.result?.text;
    const object = turn.result?.object;
    result.replaceChildren(...(text || object != null
      ? [el('h2', {}, 'Result'), object != null ? el('pre', { class: 'card mono', testid: 'result' }, JSON.stringify(object, null, 2)) : markdown(text, { class: 'card markdown', 'data-testid': 'result' })]
      : []));
    drawSteps();
    document.body.dataset.ready = 'yes';
  });

  let pending = null; // events arrive fast: the page redraws once a frame, and refetches once per change
  const REFETCH = new Set(['step-finish', 'turn-finish', 'approval-request', 'approval-decision', 'step-retry', 'turn-start']);
  refresh().then(() => guarded(() => followEvents(turnId, (event) => {
    timeline.apply(event);
    if (REFETCH.has(event.type)) refresh();
    if (!pending) pending = requestAnimationFrame(() => { pending = null; drawSteps(); });
  }, abort.signal)));
  return () => abort.abort();
}

// ------------------------------------------------------------------ approvals

function decisionCell(item) {
  const reason = el('input', { placeholder: 'reason (optional)', testid: 'reason', 'aria-label': 'reason' });
  const approve = el('button', { type: 'button', testid: 'approve' }, 'Approve');
  const deny = el('button', { type: 'button', testid: 'deny' }, 'Deny');
  const cell = el('td', {}, el('div', { class: 'actions' }, approve, deny), reason);
  const decide = (approved) => guarded(async () => {
    approve.disabled = deny.disabled = true;
    try {
      const done = await postJson(`/v1/approvals/${encodeURIComponent(item.approval_id)}`, { approved, reason: reason.value });
      const live = el('span', { testid: 'turn-live' }, 'following the turn…');
      cell.replaceChildren(el('div', { testid: 'decided' }, `${done.decision} by ${done.reviewer}`), live);
      watchTurn(item.turn_id, live);
    } finally {
      approve.disabled = deny.disabled = false;
    }
  });
  approve.onclick = () => decide(true);
  deny.onclick = () => decide(false);
  return cell;
}

const watching = new Set(); // streams the inbox opened; closed when the view is left
/** The turn's status, live from its event stream, until it finishes. */
function watchTurn(turnId, into) {
  const abort = new AbortController();
  watching.add(abort);
  let status = 'running';
  into.replaceChildren(statusBadge(status));
  guarded(() => followEvents(turnId, (event) => {
    const next = event.type === 'turn-finish' ? event.data.status : event.type === 'approval-request' ? 'awaiting_approval' : 'running';
    if (next !== status) into.replaceChildren(statusBadge((status = next)));
  }, abort.signal));
}

function approvalsView(params) {
  const state = params.get('state') === 'decided' ? 'decided' : 'pending';
  const tabs = el('div', { class: 'actions' },
    el('a', { href: '#/approvals', class: state === 'pending' ? 'current' : '' }, 'Waiting'),
    el('a', { href: '#/approvals?state=decided', class: state === 'decided' ? 'current' : '', testid: 'decided-tab' }, 'Decided'));
  const body = el('tbody');
  const head = state === 'pending' ? ['Tool and arguments', 'Turn', 'Agent', 'Waiting since', 'Expires', 'Decide'] : ['Tool and arguments', 'Turn', 'Agent', 'Decision', 'By', 'When'];
  view().replaceChildren(el('h1', {}, 'Approvals'), tabs,
    el('table', { class: 'list', testid: 'approvals' }, el('thead', {}, el('tr', {}, ...head.map((h) => el('th', {}, h)))), body));
  const shown = new Map(); // approval id -> row: a row being decided stays as it is across refreshes
  const load = () => guarded(async () => {
    const page = await getJson(`/v1/approvals?state=${state}&limit=100`);
    for (const item of page.items) {
      if (shown.has(item.approval_id)) continue;
      const first = [el('td', {}, el('strong', {}, item.tool), argsList(item.args)), el('td', {}, turnLink(item.turn_id)), el('td', {}, item.agent)];
      const rest = state === 'pending'
        ? [el('td', { class: 'meta' }, when(item.created_at)), el('td', { class: 'meta' }, when(item.expires_at)), decisionCell(item)]
        : [el('td', {}, item.decision || ''), el('td', {}, item.decided_by || ''), el('td', { class: 'meta' }, when(item.decided_at))];
      const row = el('tr', { class: 'row', testid: 'approval-row', 'data-approval': item.approval_id, 'data-turn': item.turn_id }, ...first, ...rest);
      shown.set(item.approval_id, row);
    }
    body.replaceChildren(...(shown.size ? shown.values() : [el('tr', {}, el('td', { colspan: 6, class: 'empty' }, state === 'pending' ? 'Nothing waits for a decision.' : 'No decisions yet.'))]));
    document.body.dataset.ready = 'yes';
  });
  const stop = every(3000, load);
  return () => {
    stop();
    for (const abort of watching) abort.abort();
    watching.clear();
  };
}

// ------------------------------------------------------------------ batches

function batchesView() {
  const body = el('tbody');
  view().replaceChildren(el('h1', {}, 'Batches'),
    el('p', { class: 'meta' }, 'Batches with turns among your latest 200.'),
    el('table', { class: 'list', testid: 'batches' },
      el('thead', {}, el('tr', {}, ...['Batch', 'Agent', 'Progress', 'Done', 'Failed', 'Running', 'Awaiting approval', 'Tokens'].map((h) => el('th', {}, h)))), body));
  return every(3000, () => guarded(async () => {
    const turns = await getJson('/v1/turns?limit=200');
    const ids = [...new Set(turns.items.map((t) => t.batch_id).filter(Boolean))];
    const found = await Promise.all(ids.map((id) => getJson(`/v1/batches/${encodeURIComponent(id)}`).catch(() => null)));
    const rows = found.filter(Boolean).map((b) => {
      const share = b.total ? Math.round((100 * b.finished) / b.total) : 0;
      return el('tr', { class: 'row', testid: 'batch-row', 'data-batch': b.batch_id },
        el('td', {}, el('a', { href: `#/turns?batch=${encodeURIComponent(b.batch_id)}`, class: 'mono' }, b.batch_id)),
        el('td', {}, b.agent || ''),
        el('td', {}, el('div', { class: 'progress', role: 'progressbar', 'aria-valuenow': String(share), 'aria-valuemin': '0', 'aria-valuemax': '100' }, el('span', { style: `width:${share}%` })),
          el('span', { class: 'meta', testid: 'batch-progress' }, `${b.finished}/${b.total}${b.state ? ` · ${b.state}` : ''}`)),
        el('td', {}, String(b.done)), el('td', {}, String(b.failed)), el('td', {}, String(b.running)),
        el('td', {}, String(b.awaiting_approval)), el('td', { class: 'meta' }, `${b.input_tokens} in / ${b.output_tokens} out`));
    });
    body.replaceChildren(...(rows.length ? rows : [el('tr', {}, el('td', { colspan: 8, class: 'empty' }, 'No batches among your recent turns.'))]));
    document.body.dataset.ready = 'yes';
  }));
}

// ------------------------------------------------------------------ routing

function route() {
  leave();
  document.body.dataset.ready = 'no';
  setBanner('');
  const [path, search] = (location.hash.slice(1) || '/turns').split('?');
  const params = new URLSearchParams(search || '');
  const [, section, id] = path.split('/');
  for (const link of document.querySelectorAll('header.top nav a')) {
    link.classList.toggle('current', link.getAttribute('href') === `#/${section === 'turn' ? 'turns' : section}`);
  }
  if (section === 'turn' && id) leave = turnView(decodeURIComponent(id));
  else if (section === 'approvals') leave = approvalsView(params);
  else if (section === 'batches') leave = batchesView();
  else leave = turnsView(params);
}

window.addEventListener('hashchange', route);
route();
