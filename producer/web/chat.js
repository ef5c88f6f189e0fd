// The stepq chat page: plain ES module, no build step, no network beyond this gateway.
// It speaks the same endpoints any AI SDK client does: POST /v1/chat (a UI message stream back),
// GET /v1/chat/{id}/stream (resume) and GET /v1/chat/{id}/messages (history). The small reader
// below applies UI message stream chunks the way the `ai` package's processUIMessageStream does.
// The model's text is Markdown, rendered by ./markdown.js (vendored marked + DOMPurify: no HTML of its own).

import { markdown } from './markdown.js';

const KEY_STORE = 'stepq.apiKey';
const CHATS_STORE = 'stepq.chats';
const AGENT_STORE = 'stepq.agent'; // the agent last chosen in the menu, used for new chats after a reload

const $ = (id) => document.getElementById(id);
const state = {
  chatId: null,
  agent: null,
  messages: [], // UIMessages
  busy: false,
  stopping: false, // Stop was pressed: the turn is cancelled, its stream ends on its own
  notice: '',
  agents: [], // GET /v1/agents
  threads: null, // GET /v1/threads items (null until listed: the page then shows the chats it knows itself)
};

// ------------------------------------------------------------------ HTTP

function authHeaders() {
  const key = localStorage.getItem(KEY_STORE);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

async function api(path, init = {}) {
  const sent = localStorage.getItem(KEY_STORE);
  const response = await fetch(path, { ...init, headers: { ...authHeaders(), ...(init.headers || {}) } });
  if (response.status === 401) {
    // a key was sent and refused: say so, instead of silently asking again
    await askForKey(sent ? `That key was not accepted (${(await errorOf(response)).message}). Check it and enter it again.` : '');
    return api(path, init);
  }
  return response;
}

let asking = null; // one dialog for every request that met a 401 at once
function askForKey(problem) {
  const error = $('key-error');
  error.hidden = !problem;
  error.textContent = problem;
  if (asking) return asking;
  asking = new Promise((resolve) => {
    const dialog = $('key-dialog');
    $('key-form').onsubmit = () => {
      localStorage.setItem(KEY_STORE, $('key').value.trim());
      asking = null;
      resolve();
    };
    dialog.showModal();
    $('key').focus();
  });
  return asking;
}

async function errorText(response) {
  return (await errorOf(response)).message;
}

/** The gateway's JSON error ({code, message}), or the HTTP status line when the body is not one. */
async function errorOf(response) {
  try {
    const body = await response.json();
    return { code: body.error?.code || '', message: body.error?.message || response.statusText };
  } catch {
    return { code: '', message: response.statusText };
  }
}

// what a refused send or approval answer means, for the person at the page (the API's text names endpoints)
const REFUSED = {
  'chat-busy': 'Your message was not sent: this chat is still busy with its last answer (it may be waiting for an approval). It is back in the message box; send it again once the answer is done.',
  'agent-mismatch': 'This chat talks to a different agent. Start a new chat to talk to this one.',
  forbidden: 'Your key is not allowed to do that here (answering approvals needs a key with the approve permission).',
  'rate-limited': 'Too many requests right now; wait a moment and try again.',
  unavailable: 'The server cannot do that right now; try again in a moment.',
};

/** A refused request in words for a person: the page's own sentence for a known refusal, else the gateway's. */
async function refusalText(response, action) {
  const { code, message } = await errorOf(response);
  const known = REFUSED[code] || REFUSED[{ 403: 'forbidden', 429: 'rate-limited', 503: 'unavailable' }[response.status]];
  if (known) return known;
  return `${action === 'send' ? 'Your message was not sent' : 'Your answer was not accepted'}: ${message}`;
}

// ------------------------------------------------------------------ the UI message stream reader

/** Yields each JSON chunk of an SSE UI message stream until `[DONE]` or the end of the body. */
async function* chunks(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = frame
        .split('\n')
        .filter((line) => line.startsWith('data:'))
        .map((line) => line.slice(5).trimStart())
        .join('\n');
      if (!data) continue; // a keep-alive comment
      if (data === '[DONE]') return;
      yield JSON.parse(data);
    }
  }
}

/** Applies chunks to one assistant message, as the AI SDK's client does. */
class MessageBuilder {
  constructor(message, { replay }) {
    this.message = message;
    this.replay = replay; // a resume replays the message from its start: the first `start` resets it
    this.text = {};
    this.reasoning = {};
  }

  currentStep() {
    const parts = this.message.parts;
    let i = parts.length - 1;
    while (i >= 0 && parts[i].type !== 'step-start') i--;
    return i;
  }

  tool(toolCallId) {
    return this.message.parts.findLast((p) => p.toolCallId === toolCallId);
  }

  apply(chunk) {
    const m = this.message;
    switch (chunk.type) {
      case 'start':
        if (this.replay) {
          m.parts = [];
          this.replay = false;
        }
        if (chunk.messageId) m.id = chunk.messageId;
        m.metadata = { ...(m.metadata || {}), ...(chunk.messageMetadata || {}) };
        break;
      case 'start-step':
        m.parts.push({ type: 'step-start' });
        break;
      case 'text-start':
        this.text[chunk.id] = { type: 'text', text: '', state: 'streaming' };
        m.parts.push(this.text[chunk.id]);
        break;
      case 'text-delta':
        this.text[chunk.id].text += chunk.delta;
        break;
      case 'text-end':
        this.text[chunk.id].state = 'done';
        delete this.text[chunk.id];
        break;
      case 'reasoning-start':
        this.reasoning[chunk.id] = { type: 'reasoning', text: '', state: 'streaming' };
        m.parts.push(this.reasoning[chunk.id]);
        break;
      case 'reasoning-delta':
        this.reasoning[chunk.id].text += chunk.delta;
        break;
      case 'reasoning-end':
        this.reasoning[chunk.id].state = 'done';
        delete this.reasoning[chunk.id];
        break;
      case 'tool-input-start':
        m.parts.push({ type: `tool-${chunk.toolName}`, toolCallId: chunk.toolCallId, state: 'input-streaming' });
        break;
      case 'tool-input-delta': { // the call's arguments as the model writes them: shown until they are whole
        const part = this.tool(chunk.toolCallId);
        if (part?.state === 'input-streaming') part.inputText = (part.inputText || '') + chunk.inputTextDelta;
        break;
      }
      case 'tool-input-available': {
        const part = this.tool(chunk.toolCallId);
        Object.assign(part, { state: 'input-available', input: chunk.input });
        delete part.inputText;
        break;
      }
      case 'tool-approval-request':
        Object.assign(this.tool(chunk.toolCallId), { state: 'approval-requested', approval: { id: chunk.approvalId } });
        break;
      case 'tool-approval-response': {
        const part = m.parts.find((p) => p.approval?.id === chunk.approvalId);
        if (part) Object.assign(part, { state: 'approval-responded', approval: { ...part.approval, approved: chunk.approved, reason: chunk.reason } });
        break;
      }
      case 'tool-output-available':
        Object.assign(this.tool(chunk.toolCallId), { state: 'output-available', output: chunk.output });
        break;
      case 'tool-output-error':
        Object.assign(this.tool(chunk.toolCallId), { state: 'output-error', errorText: chunk.errorText });
        break;
      case 'tool-output-denied':
        Object.assign(this.tool(chunk.toolCallId), { state: 'output-denied' });
        break;
      case 'reset-step': // a retried step: drop what it streamed before the retry
        m.parts.splice(this.currentStep() + 1);
        this.text = {};
        this.reasoning = {};
        break;
      case 'finish-step':
        this.text = {};
        this.reasoning = {};
        break;
      case 'finish':
        m.metadata = { ...(m.metadata || {}), ...(chunk.messageMetadata || {}) };
        break;
      case 'error':
        m.error = chunk.errorText;
        break;
      case 'data-retry':
        state.notice = `retrying step ${chunk.data.step + 1} (attempt ${chunk.data.attempt + 1}): ${chunk.data.error || ''}`;
        break;
      case 'data-step-reset':
        state.notice = 'the step restarted; its partial answer was dropped';
        break;
      case 'data-plan': { // the agent's task plan, whole: one part per message, updated in place
        const part = m.parts.find((p) => p.type === 'data-plan' && p.id === chunk.id);
        if (part) part.data = chunk.data;
        else m.parts.push({ type: 'data-plan', id: chunk.id, data: chunk.data });
        break;
      }
      default:
        break;
    }
  }
}

/** Reads a UI message stream into the last assistant message (or a new one). */
async function consume(response, { replay = false } = {}) {
  let message = state.messages.at(-1);
  if (!message || message.role !== 'assistant' || replay) {
    message = { id: '', role: 'assistant', parts: [], metadata: {} };
    state.messages.push(message);
  }
  const builder = new MessageBuilder(message, { replay });
  for await (const chunk of chunks(response)) {
    builder.apply(chunk);
    if (chunk.type === 'start') {
      if (chunk.messageMetadata?.threadId) knowThread(state.chatId, chunk.messageMetadata.threadId);
      // a replayed message may already be on the page (the same id): keep one copy
      const twin = state.messages.findIndex((m) => m !== message && m.id === message.id);
      if (twin >= 0) state.messages.splice(twin, 1);
    }
    render();
  }
  state.notice = '';
}

// ------------------------------------------------------------------ actions

async function send(text) {
  $('input').focus(); // the next message is typed where the last one was, whatever sent it (Enter, button, chip)
  const user = { id: newId(), role: 'user', parts: [{ type: 'text', text }] };
  state.messages.push(user);
  remember(text);
  const refused = await post([...state.messages], 'submit-message', undefined, 'send');
  if (refused === null) return;
  // not sent: the message leaves the transcript and goes back to the box
  state.messages = state.messages.filter((m) => m !== user);
  if (!$('input').value) $('input').value = text;
  await resync(refused);
}

/** POSTs the chat and follows the answer; a refusal comes back as a sentence for a person (null when sent). */
async function post(messages, trigger, messageId, action) {
  state.busy = true;
  setBanner('');
  render();
  try {
    const response = await api(`/v1/chat?agent=${encodeURIComponent(state.agent)}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ id: state.chatId, messages, trigger, messageId }),
    });
    if (!response.ok) return await refusalText(response, action);
    await consume(response);
  } catch (error) {
    setBanner(`connection lost: ${error.message}; reload to reconnect`, true);
  } finally {
    state.busy = false;
    state.stopping = false;
    render();
    loadThreads();
  }
  return null;
}

/** Stop: cancel the turn being answered (POST /v1/turns/{id}/cancel). Its stream then ends by itself, with
 * the status `cancelled`, so what the page shows is what the server kept. */
async function stop() {
  const message = state.messages.at(-1);
  if (!state.busy || state.stopping || message?.role !== 'assistant' || !message.id) return;
  state.stopping = true;
  render();
  const response = await api(`/v1/turns/${encodeURIComponent(message.id)}/cancel`, { method: 'POST' });
  if (!response.ok) {
    state.stopping = false;
    setBanner(`Could not stop the answer: ${await errorText(response)}`, true);
  }
  render();
  $('input').focus();
}

async function decide(message, part, approved) {
  part.state = 'approval-responded';
  part.approval = { ...part.approval, approved, reason: approved ? undefined : 'denied in the chat page' };
  render();
  const others = message.parts.filter((p) => p.state === 'approval-requested');
  if (others.length) return; // answer every pending call of the step, then send them together
  const upToIt = state.messages.slice(0, state.messages.indexOf(message) + 1); // the answers are the last message
  const refused = await post(upToIt, 'submit-message', message.id, 'decide');
  if (refused !== null) await resync(refused); // the server decided nothing: its cards come back as they are
}

/** After a refused action: the chat as the server has it (history, then the active answer), with why. */
async function resync(explanation) {
  await openChat(state.chatId, state.agent, explanation);
}

/** The answers still waiting for a person in the chat's last message: the composer waits for them. */
function pendingApprovals() {
  const last = state.messages.at(-1);
  return last?.role === 'assistant' ? last.parts.filter((p) => p.state === 'approval-requested') : [];
}

async function openChat(chatId, agent, explanation = '') {
  state.chatId = chatId;
  state.agent = agent || state.agent;
  state.messages = [];
  state.notice = '';
  location.hash = `chat=${encodeURIComponent(chatId)}`;
  setBanner(explanation, Boolean(explanation));
  renderThreads();
  render();
  const history = await api(`/v1/chat/${encodeURIComponent(chatId)}/messages`);
  if (!history.ok) {
    setBanner(await errorText(history), true);
    return;
  }
  const body = await history.json();
  if (state.chatId !== chatId) return;
  state.messages = body.messages;
  if (body.agent) state.agent = body.agent;
  $('agent').value = state.agent; // the menu shows who this chat talks to
  render();
  document.body.dataset.ready = 'yes';
  if (body.active) await resume(chatId, explanation);
}

/** Follows the chat's active answer; an explanation (why the page re-synced) stays up instead of the
 * reconnect notes. */
async function resume(chatId, explanation = '') {
  const note = (text) => setBanner(explanation || text, Boolean(explanation));
  note('Reconnecting to the answer in progress…');
  state.busy = true;
  render();
  try {
    const response = await api(`/v1/chat/${encodeURIComponent(chatId)}/stream`);
    if (response.status === 204) return;
    if (!response.ok) {
      setBanner(await errorText(response), true);
      return;
    }
    note('Reconnected: following the answer in progress');
    await consume(response, { replay: true });
    note('');
  } finally {
    state.busy = false;
    state.stopping = false;
    render();
  }
}

// ------------------------------------------------------------------ the chat list
// The server's list (GET /v1/threads: every chat of this tenant, from any browser) merged with the chats this
// browser started: a chat keeps the id it was opened with here; one started elsewhere opens by its thread id.

function chats() {
  try {
    return JSON.parse(localStorage.getItem(CHATS_STORE) || '[]');
  } catch {
    return [];
  }
}

function saveChats(list) {
  localStorage.setItem(CHATS_STORE, JSON.stringify(list.slice(0, 100)));
}

function remember(text) {
  const existing = chats().find((c) => c.id === state.chatId);
  const list = chats().filter((c) => c.id !== state.chatId);
  list.unshift({ ...existing, id: state.chatId, agent: state.agent, title: existing?.title || text.slice(0, 60), at: Date.now() });
  saveChats(list);
  renderThreads();
}

/** The thread behind a chat this browser knows (the stream's metadata names it), to match the server's list. */
function knowThread(chatId, threadId) {
  const list = chats();
  const entry = list.find((c) => c.id === chatId);
  if (!entry || entry.threadId === threadId) return;
  entry.threadId = threadId;
  saveChats(list);
  renderThreads();
}

async function loadThreads() {
  try {
    const response = await api('/v1/threads?limit=50');
    if (!response.ok) return; // the chats this browser knows stay listed
    state.threads = (await response.json()).items;
  } catch {
    return;
  }
  renderThreads();
}

function chatList() {
  const local = chats();
  if (state.threads === null) return local;
  const byThread = new Map(local.filter((c) => c.threadId).map((c) => [c.threadId, c]));
  const listed = state.threads.map((t) => {
    const here = byThread.get(t.thread_id);
    return { id: here?.id || t.thread_id, agent: t.agent, title: t.title || here?.title, threadId: t.thread_id, running: t.status === 'running' };
  });
  const onServer = new Set(state.threads.map((t) => t.thread_id));
  const unlisted = local.filter((c) => !c.threadId && !onServer.has(c.id)); // begun here, not yet on the server
  return [...unlisted, ...listed];
}

function newId() {
  return crypto.randomUUID ? crypto.randomUUID() : `${Date.now().toString(36)}${Math.random().toString(36).slice(2)}`;
}

// ------------------------------------------------------------------ rendering

function setBanner(text, isError = false) {
  const banner = $('banner');
  banner.hidden = !text;
  banner.textContent = text;
  banner.classList.toggle('error', isError);
}

function renderThreads() {
  const nav = $('threads');
  nav.replaceChildren(
    ...chatList().map((chat) => {
      const link = document.createElement('a');
      link.href = `#chat=${encodeURIComponent(chat.id)}`;
      link.textContent = chat.title || chat.id;
      link.dataset.testid = 'thread';
      link.dataset.chatId = chat.id;
      link.classList.toggle('current', chat.id === state.chatId);
      link.onclick = (event) => {
        event.preventDefault();
        if (!state.busy) openChat(chat.id, chat.agent);
      };
      return link;
    }),
  );
}

let scheduled = false;
function render() {
  if (scheduled) return;
  scheduled = true;
  requestAnimationFrame(() => {
    scheduled = false;
    draw();
  });
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === 'testid') node.dataset.testid = value;
    else if (name === 'onclick') node.onclick = value;
    else node.setAttribute(name, value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

const json = (value) => (typeof value === 'string' ? value : JSON.stringify(value, null, 2));

// what a tool call's state means to the person reading the chat (never the SDK's state names)
const TOOL_STATUS = {
  'input-streaming': 'preparing',
  'input-available': 'running',
  'approval-requested': 'waiting for your approval',
  'output-available': 'done',
  'output-error': 'failed',
  'output-denied': 'denied',
};

function toolStatus(part) {
  if (part.state === 'approval-responded') return part.approval?.approved ? 'approved, running' : 'denied';
  return TOOL_STATUS[part.state] || 'running';
}

/** "lookup_order" -> "Lookup order": the tool's name as a heading; the exact name stays in its title. */
const humanName = (name) => {
  const words = name.replace(/[_.-]+/g, ' ').trim();
  return words.charAt(0).toUpperCase() + words.slice(1);
};

/** Arguments or a result as a two-column table (name, value); anything else as a block of JSON. */
function valueTable(value, testid) {
  if (!value || typeof value !== 'object' || Array.isArray(value) || !Object.keys(value).length) {
    return el('pre', { testid }, json(value ?? ''));
  }
  const table = el('table', { class: 'args', testid });
  for (const [key, item] of Object.entries(value)) {
    const shown = typeof item === 'string' ? item : JSON.stringify(item);
    table.append(el('tr', { testid: `${testid}-row` }, el('th', { scope: 'row' }, key), el('td', {}, el('code', {}, shown))));
  }
  return table;
}

function drawTool(message, part) {
  const name = part.type.slice('tool-'.length);
  const status = toolStatus(part);
  const box = el('div', { class: 'tool', testid: 'tool', 'data-tool': name, 'data-state': part.state, role: 'group', 'aria-label': `${humanName(name)}: ${status}` },
    el('div', { class: 'head' },
      el('span', { class: 'name', testid: 'tool-name', title: name }, humanName(name)),
      el('span', { class: 'status', testid: 'tool-status' }, status)),
    part.input !== undefined ? valueTable(part.input, 'tool-input')
      : part.inputText ? el('pre', { class: 'input-streaming', testid: 'tool-input-streaming' }, part.inputText) : null);
  if (part.state === 'approval-requested') {
    box.append(
      el('button', { type: 'button', testid: 'approve', onclick: () => decide(message, part, true) }, 'Approve'),
      el('button', { type: 'button', testid: 'deny', onclick: () => decide(message, part, false) }, 'Deny'),
    );
  } else if (part.state === 'output-available') {
    box.append(el('div', { class: 'caption' }, 'Result'), valueTable(part.output, 'tool-output'));
  } else if (part.state === 'output-error') {
    box.append(el('pre', { class: 'error', testid: 'tool-error' }, part.errorText));
  } else if (part.state === 'output-denied') {
    box.append(el('div', { class: 'error', testid: 'tool-denied' }, 'You denied this call; the agent was told.'));
  }
  return box;
}

const PLAN_MARKS = { pending: '○', running: '◐', done: '●', failed: '✕', skipped: '–' };

/** The task plan, drawn above the message's other parts (it is progress, not content). */
function drawPlan(part) {
  const box = el('ol', { class: 'plan', testid: 'plan' });
  for (const row of part.data.steps || []) {
    box.append(el('li', { class: `plan-step ${row.status}`, testid: 'plan-step', 'data-status': row.status },
      `${PLAN_MARKS[row.status] || '○'} ${row.label}`));
  }
  return box;
}

function drawMessage(message) {
  const box = el('div', { class: `msg ${message.role}`, testid: `message-${message.role}`, 'data-id': message.id });
  for (const part of message.parts.filter((p) => p.type === 'data-plan')) box.append(drawPlan(part));
  for (const part of message.parts) {
    if (part.type === 'text') {
      box.append(message.role === 'user' ? el('div', { class: 'text', testid: 'text' }, part.text) : markdown(part.text, { class: 'text markdown', 'data-testid': 'text' }));
    }
    else if (part.type === 'reasoning') {
      box.append(el('details', { class: 'reasoning', testid: 'reasoning' }, el('summary', {}, 'Reasoning'), part.text));
    } else if (part.type.startsWith('tool-')) box.append(drawTool(message, part));
  }
  if (message.error) box.append(el('div', { class: 'error', testid: 'error' }, message.error));
  if (message.role === 'assistant' && message.metadata?.status) box.dataset.status = message.metadata.status;
  if (message.metadata?.status === 'cancelled') box.append(el('div', { class: 'notice', testid: 'stopped' }, 'Stopped.'));
  return box;
}

function draw() {
  const list = $('messages');
  list.replaceChildren(...state.messages.map(drawMessage));
  if (state.notice) list.append(el('div', { class: 'notice', testid: 'notice' }, state.notice));
  list.scrollTop = list.scrollHeight;
  const awaiting = pendingApprovals().length > 0; // a new message would be refused until they are answered
  $('input').disabled = awaiting;
  $('send').disabled = state.busy || awaiting;
  $('composer-hint').hidden = !awaiting;
  const stopButton = $('stop');
  stopButton.hidden = !state.busy;
  stopButton.disabled = state.stopping;
  stopButton.textContent = state.stopping ? 'Stopping…' : 'Stop';
  document.body.dataset.busy = state.busy ? 'yes' : 'no';
  drawSuggestions();
}

/** The agent's starter prompts, while the chat is empty: one click sends one. */
function drawSuggestions() {
  const box = $('suggestions');
  const agent = state.agents.find((a) => a.id === state.agent);
  const offered = !state.messages.length && !state.busy ? agent?.suggestions || [] : [];
  box.hidden = !offered.length;
  box.replaceChildren(...offered.map((s) => el('button', { type: 'button', testid: 'suggestion', onclick: () => send(s.prompt || s.label) }, s.label)));
}

// ------------------------------------------------------------------ start

/** The agent a new chat talks to: the URL's, else the one chosen last in this browser, else the first chat
 * agent (object-mode agents answer with JSON for pipelines, not with conversation). */
function defaultAgent(agents, asked) {
  const known = (id) => id && agents.some((a) => a.id === id);
  if (known(asked)) return asked;
  const remembered = localStorage.getItem(AGENT_STORE);
  if (known(remembered)) return remembered;
  return (agents.find((a) => a.execution_mode !== 'object') || agents[0])?.id || asked;
}

async function loadAgents(asked) {
  const response = await api('/v1/agents');
  if (!response.ok) {
    setBanner(`The agents could not be listed: ${await errorText(response)}`, true);
    return;
  }
  const { agents } = await response.json();
  state.agents = agents;
  const select = $('agent');
  select.replaceChildren(...agents.map((a) => el('option', { value: a.id }, a.label && a.label !== a.id ? `${a.label} (${a.id})` : a.id)));
  state.agent = defaultAgent(agents, asked);
  select.value = state.agent;
  select.onchange = () => {
    localStorage.setItem(AGENT_STORE, select.value);
    if (state.busy) return; // the answer in progress keeps its chat; the choice applies to the next one
    if (state.messages.length) openChat(newId(), select.value); // a chat keeps its agent: a new one starts
    else {
      state.agent = select.value;
      render();
    }
  };
}

async function main() {
  const params = new URLSearchParams(location.hash.slice(1));
  const query = new URLSearchParams(location.search);
  await loadAgents(query.get('agent'));
  $('stop').onclick = stop;
  $('new-chat').onclick = () => {
    state.agent = $('agent').value;
    openChat(newId(), state.agent);
  };
  $('composer').onsubmit = (event) => {
    event.preventDefault();
    const text = $('input').value.trim();
    if (!text || state.busy || pendingApprovals().length) return;
    $('input').value = '';
    send(text);
  };
  $('input').onkeydown = (event) => {
    if (event.key === 'Enter' && !event.shiftKey) {
      event.preventDefault();
      $('composer').requestSubmit();
    }
  };
  window.addEventListener('storage', (event) => {
    if (event.key === CHATS_STORE) renderThreads(); // a chat started in another tab
  });
  loadThreads();
  const chatId = params.get('chat');
  const known = chats().find((c) => c.id === chatId);
  await openChat(chatId || newId(), known?.agent || state.agent);
}

main();
