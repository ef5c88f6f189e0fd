// The console's HTTP: the gateway's own routes with the key kept in this browser (the chat page's key:
// same gateway, same auth), JSON errors in words, and server-sent events read from a fetch (EventSource
// cannot send an Authorization header).

const KEY_STORE = 'stepq.apiKey';
const $ = (id) => document.getElementById(id);

let asking = null; // one dialog for every request that met a 401 at once

function askForKey(problem) {
  const error = $('key-error');
  error.hidden = !problem;
  error.textContent = problem;
  if (asking) return asking;
  asking = new Promise((resolve) => {
    $('key-form').onsubmit = () => {
      localStorage.setItem(KEY_STORE, $('key').value.trim());
      asking = null;
      resolve();
    };
    $('key-dialog').showModal();
    $('key').focus();
  });
  return asking;
}

/** The gateway's error message for a refused request, or its status line. */
export async function errorText(response) {
  try {
    const body = await response.json();
    return body.error?.message || response.statusText;
  } catch {
    return response.statusText;
  }
}

export class HttpError extends Error {}

/** fetch with the browser's key; a 401 asks for a key (saying why when one was refused) and tries again. */
export async function request(path, init = {}) {
  const key = localStorage.getItem(KEY_STORE);
  const headers = { ...(key ? { Authorization: `Bearer ${key}` } : {}), ...(init.headers || {}) };
  const response = await fetch(path, { ...init, headers });
  if (response.status === 401) {
    await askForKey(key ? `That key was not accepted (${await errorText(response)}). Check it and enter it again.` : '');
    return request(path, init);
  }
  return response;
}

/** The JSON body of a successful request; a refusal throws an HttpError carrying the gateway's message. */
export async function getJson(path, init = {}) {
  const response = await request(path, init);
  if (!response.ok) throw new HttpError(`${response.status}: ${await errorText(response)}`);
  return response.json();
}

export const postJson = (path, body) =>
  getJson(path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body ?? {}) });

/** Follows a turn's events (GET /v1/turns/{id}/events) from the start: `onEvent` gets each, in order, once;
 * returns when the stream ends (after `turn-finish`) or `signal` aborts. */
export async function followEvents(turnId, onEvent, signal) {
  const response = await request(`/v1/turns/${encodeURIComponent(turnId)}/events`, { signal });
  if (!response.ok) throw new HttpError(`${response.status}: ${await errorText(response)}`);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const frame = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = frame.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trimStart()).join('\n');
        if (data) onEvent(JSON.parse(data));
      }
    }
  } catch (error) {
    if (error.name !== 'AbortError') throw error;
  }
}
