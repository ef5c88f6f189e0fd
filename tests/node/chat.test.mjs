// Conformance: the real AI SDK client (`ai` on npm) against a running stepq gateway.
// Started by tests/test_chat_node.py, which passes the gateway URL, an API key and a control URL
// (releases the `chat_wait` tool of tests/agents_chat.py) in the environment.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  readUIMessageStream,
} from 'ai';

const GATEWAY = process.env.STEPQ_GATEWAY_URL;
const KEY = process.env.STEPQ_API_KEY;
const CONTROL = process.env.STEPQ_CONTROL_URL;
const HEADERS = { Authorization: `Bearer ${KEY}` };
const WAIT_MS = 60_000;

/** The state a UI framework keeps for a Chat (what @ai-sdk/react's ReactChatState does, minus React). */
class PlainChatState {
  constructor() {
    this._status = 'ready';
    this.error = undefined;
    this.messages = [];
    this.listeners = new Set();
  }
  get status() {
    return this._status;
  }
  set status(value) {
    this._status = value;
    this.notify();
  }
  notify() {
    for (const listener of [...this.listeners]) listener();
  }
  pushMessage = (message) => {
    this.messages = this.messages.concat(message);
    this.notify();
  };
  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
    this.notify();
  };
  replaceMessage = (index, message) => {
    this.messages = [...this.messages.slice(0, index), this.snapshot(message), ...this.messages.slice(index + 1)];
    this.notify();
  };
  snapshot = (thing) => structuredClone(thing);
}

class TestChat extends AbstractChat {
  constructor(options) {
    const state = new PlainChatState();
    super({ ...options, state });
    this.plain = state;
  }
  /** Resolves when `predicate(chat)` holds; checked on every state change (no polling, no sleeps). */
  until(predicate, what) {
    return new Promise((resolve, reject) => {
      const check = () => {
        if (predicate(this)) {
          this.plain.listeners.delete(check);
          clearTimeout(timer);
          resolve();
        }
      };
      const timer = setTimeout(() => {
        this.plain.listeners.delete(check);
        reject(new Error(`timed out waiting for ${what}; messages: ${JSON.stringify(this.messages)}`));
      }, WAIT_MS);
      this.plain.listeners.add(check);
      check();
    });
  }
}

function transport(agent, extra = {}) {
  return new DefaultChatTransport({ api: `${GATEWAY}/v1/chat?agent=${agent}`, headers: HEADERS, ...extra });
}

const chatId = (name) => `${name}-${Math.random().toString(36).slice(2, 10)}`;
const textOf = (message) => message.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
const lastText = (message) => message.parts.filter((p) => p.type === 'text').at(-1)?.text;
const toolParts = (message) => message.parts.filter((p) => p.type.startsWith('tool-'));

async function turn(turnId) {
  const response = await fetch(`${GATEWAY}/v1/turns/${turnId}`, { headers: HEADERS });
  assert.equal(response.status, 200, await response.clone().text());
  return response.json();
}

async function release(turnId) {
  const response = await fetch(`${CONTROL}/release/${turnId}`, { method: 'POST' });
  assert.equal(response.status, 200);
}

/** Sends one user message with the bare transport and rebuilds the answer with readUIMessageStream. */
async function ask(agent, text, id = chatId(agent), onChunk = () => {}) {
  const chunks = [];
  const stream = await transport(agent).sendMessages({
    chatId: id,
    trigger: 'submit-message',
    messageId: undefined,
    abortSignal: undefined,
    messages: [{ id: `u-${id}`, role: 'user', parts: [{ type: 'text', text }] }],
  });
  // logged as they arrive, copied: the reader reuses a data chunk's object as the message part it updates
  const logged = stream.pipeThrough(
    new TransformStream({
      transform(chunk, controller) {
        chunks.push(structuredClone(chunk));
        onChunk(chunk);
        controller.enqueue(chunk);
      },
    }),
  );
  let message;
  for await (const snapshot of readUIMessageStream({ stream: logged, terminateOnError: true })) message = snapshot;
  assertWellNested(chunks);
  return { message, chunks, id };
}

/** The step nesting a strict UI stream consumer enforces: each step is one `start-step … finish-step`, and
 * what a step streams (its parts, its reset) comes between the two. */
function assertWellNested(chunks) {
  let open = false;
  chunks.forEach((chunk, i) => {
    const where = `chunk ${i} of ${chunks.map((c) => c.type).join(',')}`;
    if (chunk.type === 'start-step') {
      assert.ok(!open, `start-step inside an open step: ${where}`);
      open = true;
    } else if (chunk.type === 'finish-step') {
      assert.ok(open, `finish-step without start-step: ${where}`);
      open = false;
    } else if (chunk.type === 'reset-step' || /^(text|reasoning|tool-input)-/.test(chunk.type)) {
      assert.ok(open, `${chunk.type} outside a step: ${where}`);
    }
  });
  assert.ok(!open, 'the message finished inside an open step');
}

test('text and reasoning: the rebuilt message is the turn', async () => {
  const { message, chunks } = await ask('chat.plain', 'hello');
  assert.equal(message.role, 'assistant');
  const turnId = message.metadata.turnId;
  assert.equal(message.id, turnId);
  const state = await turn(turnId);
  assert.equal(state.status, 'completed');
  assert.equal(textOf(message), state.result.text);
  assert.equal(state.result.text, 'Hello from stepq: this answer streams to the chat in several small pieces.');
  const reasoning = message.parts.filter((p) => p.type === 'reasoning');
  assert.equal(reasoning.length, 1);
  assert.equal(reasoning[0].text, 'Thinking it over before answering.');
  assert.equal(message.metadata.finishReason, 'stop');
  assert.ok(message.metadata.usage.output_tokens > 0);
  // streamed in pieces, not one block
  assert.ok(chunks.filter((c) => c.type === 'text-delta').length > 1);
  assert.equal(chunks[0].type, 'start');
  assert.equal(chunks.at(-1).type, 'finish');
});

test('tools: the tool part carries its input and output', async () => {
  const { message } = await ask('chat.tools', 'what is alpha?');
  const [part, ...rest] = toolParts(message);
  assert.equal(rest.length, 0);
  assert.equal(part.type, 'tool-chat_lookup');
  assert.equal(part.state, 'output-available');
  assert.deepEqual(part.input, { key: 'alpha' });
  assert.deepEqual(part.output, { key: 'alpha', value: 'the first letter' });
  const state = await turn(message.metadata.turnId);
  assert.equal(lastText(message), state.result.text, 'the last step answers');
  assert.equal(textOf(message), 'Looking it up.Alpha is the first letter.');
  assert.equal(message.parts.filter((p) => p.type === 'step-start').length, 2);
});

test('tool input streams: the client builds the tool part from input deltas, then the whole input', async () => {
  const { message, chunks } = await ask('chat.tool_input', 'look alpha up');
  const types = chunks.map((c) => c.type);
  const id = chunks.find((c) => c.type === 'tool-input-start').toolCallId;
  const ofCall = chunks.filter((c) => c.toolCallId === id).map((c) => c.type);
  assert.equal(ofCall.filter((t) => t === 'tool-input-start').length, 1, `one start: ${ofCall.join(',')}`);
  assert.equal(ofCall[0], 'tool-input-start');
  const available = ofCall.indexOf('tool-input-available');
  const deltas = chunks.filter((c) => c.type === 'tool-input-delta' && c.toolCallId === id);
  assert.ok(deltas.length > 1, `the input streamed in pieces: ${types.join(',')}`);
  assert.ok(ofCall.lastIndexOf('tool-input-delta') < available, 'every piece comes before the whole input');
  const expected = { key: 'alpha, asked about at some length so that the argument streams in several pieces' };
  assert.deepEqual(JSON.parse(deltas.map((c) => c.inputTextDelta).join('')), expected);
  const [part, ...rest] = toolParts(message);
  assert.equal(rest.length, 0);
  assert.equal(part.type, 'tool-chat_lookup');
  assert.equal(part.state, 'output-available');
  assert.deepEqual(part.input, expected);
});

test('tool input streams: the part is input-streaming with a partial input before the call is final', async () => {
  const snapshots = [];
  const id = chatId('chat.tool_input');
  const stream = await transport('chat.tool_input').sendMessages({
    chatId: id,
    trigger: 'submit-message',
    messageId: undefined,
    abortSignal: undefined,
    messages: [{ id: `u-${id}`, role: 'user', parts: [{ type: 'text', text: 'look alpha up' }] }],
  });
  for await (const snapshot of readUIMessageStream({ stream, terminateOnError: true })) {
    const [part] = toolParts(snapshot);
    if (part) snapshots.push(structuredClone(part));
  }
  const partial = snapshots.filter((p) => p.state === 'input-streaming' && p.input !== undefined);
  assert.ok(partial.length > 0, `a partial input was seen: ${snapshots.map((p) => p.state).join(',')}`);
  assert.equal(typeof partial[0].input.key, 'string');
  assert.ok(partial[0].input.key.length < 80, 'the first partial input is a prefix of the argument');
  assert.equal(snapshots.at(-1).state, 'output-available');
});

test('a task plan streams as one data-plan part, updated in place as its tool runs', async () => {
  const { message, chunks } = await ask('chat.plan', 'what is alpha?');
  const updates = chunks.filter((c) => c.type === 'data-plan');
  assert.deepEqual(
    updates.map((c) => c.data.steps.map((s) => s.status)),
    [['pending', 'pending'], ['running', 'pending'], ['done', 'pending']],
  );
  assert.ok(updates.every((c) => c.id === 'plan' && !c.transient));
  const plans = message.parts.filter((p) => p.type === 'data-plan');
  assert.equal(plans.length, 1, 'each update replaces the one plan part');
  assert.deepEqual(plans[0].data.steps.map((s) => [s.label, s.status]), [['Look up alpha', 'done'], ['Answer', 'pending']]);
  const state = await turn(message.metadata.turnId);
  assert.deepEqual(state.plan.map((s) => [s.label, s.status]), [['Look up alpha', 'done'], ['Answer', 'pending']]);
  assert.equal(lastText(message), 'Alpha is the first letter.');
});

for (const approved of [true, false]) {
  test(`approval round trip with useChat's Chat (${approved ? 'approve' : 'deny'})`, async () => {
    const chat = new TestChat({
      id: chatId('approval'),
      transport: transport('chat.gated'),
      sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    });
    await chat.sendMessage({ text: 'please record this' });
    assert.equal(chat.status, 'ready', String(chat.error));
    const asked = chat.lastMessage;
    const [gated] = toolParts(asked);
    assert.equal(gated.type, 'tool-chat_record');
    assert.equal(gated.state, 'approval-requested');
    assert.deepEqual(gated.input, { label: 'audit' });
    assert.match(gated.approval.id, /^apv_/);
    assert.equal(asked.metadata.status, 'awaiting_approval');
    assert.equal((await turn(asked.id)).status, 'awaiting_approval');

    await chat.addToolApprovalResponse({ id: gated.approval.id, approved, reason: approved ? undefined : 'not today' });
    await chat.until(
      (c) => c.status === 'ready' && c.lastMessage.metadata?.status === 'completed',
      'the turn to finish after the approval response',
    );
    assert.equal(chat.messages.length, 2, 'the continuation extends the same assistant message');
    const done = chat.lastMessage;
    assert.equal(done.id, asked.id);
    const [result] = toolParts(done);
    const state = await turn(done.id);
    assert.equal(state.status, 'completed');
    assert.equal(lastText(done), state.result.text);
    assert.equal(textOf(done), 'I will record it.That is settled.');
    if (approved) {
      assert.equal(result.state, 'output-available');
      assert.deepEqual(result.output, { recorded: 'audit' });
    } else {
      assert.equal(result.state, 'output-denied');
    }
  });
}

test('resume after a dropped connection yields the same final message', async () => {
  // a fetch whose first response body breaks like a dropped connection once text has arrived
  let dropped = false;
  let drop;
  const dropping = async (url, init) => {
    const response = await fetch(url, init);
    if (dropped || init?.method !== 'POST') return response;
    dropped = true;
    const reader = response.body.getReader();
    const body = new ReadableStream({
      start(controller) {
        drop = () => controller.error(new TypeError('network error: connection dropped'));
      },
      async pull(controller) {
        const { value, done } = await reader.read();
        if (done) controller.close();
        else controller.enqueue(value);
      },
    });
    return new Response(body, { status: response.status, headers: response.headers });
  };
  const chat = new TestChat({ id: chatId('resume'), transport: transport('chat.gate', { fetch: dropping }) });
  const sending = chat.sendMessage({ text: 'two parts please' });
  await chat.until((c) => c.lastMessage?.role === 'assistant' && textOf(c.lastMessage).includes('First part'), 'first part');
  const turnId = chat.lastMessage.id;
  drop();
  await sending;
  assert.equal(chat.status, 'error', 'the dropped connection surfaces as an error');
  const resuming = chat.resumeStream();
  await chat.until((c) => c.status === 'streaming', 'the resumed stream');
  await release(turnId);
  await resuming;
  assert.equal(chat.status, 'ready', String(chat.error));
  const resumed = chat.lastMessage;
  assert.equal(chat.messages.length, 2);
  assert.equal(resumed.id, turnId);

  const state = await turn(turnId);
  assert.equal(lastText(resumed), state.result.text);
  assert.equal(textOf(resumed), 'First part, streamed before the gate.Second part, after the gate opened.');
  const [wait] = toolParts(resumed);
  assert.equal(wait.state, 'output-available');
  assert.deepEqual(wait.output, { released: true });
});


test('resume of a finished chat answers 204; of a running one replays the whole message', async () => {
  const none = await fetch(`${GATEWAY}/v1/chat/${chatId('nothing')}/stream`, { headers: HEADERS });
  assert.equal(none.status, 204);

  const id = chatId('replay');
  const first = new TestChat({ id, transport: transport('chat.gate') });
  const sending = first.sendMessage({ text: 'two parts please' });
  await first.until((c) => c.lastMessage?.role === 'assistant' && textOf(c.lastMessage).includes('First part'), 'first part');
  const turnId = first.lastMessage.id;

  // a second tab on the same chat: it has the user message and resumes the active stream
  const second = new TestChat({ id, transport: transport('chat.gate') });
  second.plain.messages = [first.messages[0]];
  const resuming = second.resumeStream();
  await second.until((c) => c.lastMessage?.role === 'assistant' && textOf(c.lastMessage).includes('First part'), 'replay');
  await release(turnId);
  await Promise.all([sending, resuming]);
  assert.equal(first.status, 'ready', String(first.error));
  assert.equal(second.status, 'ready', String(second.error));
  assert.deepEqual(strip(second.lastMessage), strip(first.lastMessage));
  assert.equal((await fetch(`${GATEWAY}/v1/chat/${id}/stream`, { headers: HEADERS })).status, 204);
});

/** The message without per-connection detail (part states and ids are what both clients must agree on). */
function strip(message) {
  return JSON.parse(JSON.stringify(message));
}

test('a step reset after streamed text leaves no duplicated text', async () => {
  const { message, chunks } = await ask('chat.reset', 'go');
  const types = chunks.map((c) => c.type);
  assert.ok(types.includes('reset-step'), `the step was reset: ${types.join(',')}`);
  assert.ok(types.includes('data-retry'));
  const state = await turn(message.metadata.turnId);
  assert.equal(state.status, 'completed');
  const sentence = 'This sentence streams, breaks, and streams again.';
  assert.equal(state.result.text, sentence);
  assert.equal(textOf(message), sentence);
  assert.equal(message.parts.filter((p) => p.type === 'text').length, 1);
  assert.equal(message.parts.filter((p) => p.type === 'step-start').length, 1);
  // the text before the reset really did reach the client
  const beforeReset = chunks.slice(0, types.indexOf('reset-step')).filter((c) => c.type === 'text-delta');
  assert.ok(beforeReset.length > 0);
});

test('an object-mode repair: the invalid answer is reset inside its step, the repair answers in the next', async () => {
  const { message, chunks } = await ask('chat.repair', 'Ada Lovelace, no email given');
  const types = chunks.map((c) => c.type);
  const reset = types.indexOf('reset-step');
  assert.ok(reset > 0, `the invalid answer's step was reset: ${types.join(',')}`);
  assert.ok(chunks.slice(0, reset).some((c) => c.type === 'text-delta'), 'the invalid answer reached the client first');
  assert.equal(types.filter((t) => t === 'start-step').length, 2, 'one step per model call');
  const state = await turn(message.metadata.turnId);
  assert.equal(state.status, 'completed');
  const card = { name: 'Ada Lovelace', email: 'ada@engines.example' };
  assert.deepEqual(state.result.object, card);
  assert.deepEqual(message.metadata.object, card);
  const texts = message.parts.filter((p) => p.type === 'text');
  assert.equal(texts.length, 1, 'the invalid answer left no text part');
  assert.deepEqual(JSON.parse(texts[0].text), card);
});

test('a worker killed mid-step: the redelivered step replaces its partial text', async () => {
  let killed;
  const { message, chunks } = await ask('chat.slow', 'go slowly', chatId('kill'), (chunk) => {
    if (chunk.type === 'text-delta' && !killed) {
      killed = fetch(`${CONTROL}/worker/kill`, { method: 'POST' });
    }
  });
  await killed;
  const types = chunks.map((c) => c.type);
  const reset = types.indexOf('reset-step');
  assert.ok(reset > 0, `the redelivered step was reset: ${types.join(',')}`);
  assert.ok(chunks.slice(0, reset).some((c) => c.type === 'text-delta'), 'partial text reached the client first');
  const sentence = 'One slow sentence, streamed a few characters at a time, long enough to kill its worker.';
  const state = await turn(message.metadata.turnId);
  assert.equal(state.status, 'completed');
  assert.equal(state.result.text, sentence);
  assert.equal(textOf(message), sentence);
  assert.equal(message.parts.filter((p) => p.type === 'text').length, 1);
});

test("a turn that fails reaches the client as the protocol's error chunk", async () => {
  const errors = [];
  const stream = await transport('chat.fails').sendMessages({
    chatId: chatId('fails'),
    trigger: 'submit-message',
    messageId: undefined,
    abortSignal: undefined,
    messages: [{ id: 'u-fails', role: 'user', parts: [{ type: 'text', text: 'go' }] }],
  });
  let message;
  for await (const snapshot of readUIMessageStream({ stream, onError: (e) => errors.push(e) })) message = snapshot;
  assert.equal(errors.length, 1);
  assert.match(errors[0].message, /provider error after content was streamed/);
  assert.equal(message.metadata.status, 'failed');
  assert.equal(message.metadata.finishReason, 'error');
  assert.equal((await turn(message.metadata.turnId)).status, 'failed');
});

test('bad requests get a clear error, not a stream', async () => {
  const post = (body, agent = 'chat.plain') =>
    fetch(`${GATEWAY}/v1/chat?agent=${agent}`, {
      method: 'POST',
      headers: { ...HEADERS, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
  const file = await post({
    id: chatId('file'),
    trigger: 'submit-message',
    messages: [{ id: 'u1', role: 'user', parts: [{ type: 'file', mediaType: 'image/png', url: 'data:image/png;base64,AA==' }] }],
  });
  assert.equal(file.status, 415);
  assert.match((await file.json()).error.message, /file/);
  const unknown = await post(
    { id: chatId('agent'), trigger: 'submit-message', messages: [{ id: 'u1', role: 'user', parts: [{ type: 'text', text: 'hi' }] }] },
    'no.such_agent',
  );
  assert.equal(unknown.status, 400);
  const anonymous = await fetch(`${GATEWAY}/v1/chat?agent=chat.plain`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ id: 'x', messages: [] }),
  });
  assert.equal(anonymous.status, 401);
});
