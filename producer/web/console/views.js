// The console's small DOM helpers and formatting (no framework: plain elements).

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === 'testid') node.dataset.testid = value;
    else if (name.startsWith('on')) node[name] = value;
    else node.setAttribute(name, value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}

export const money = (value) => (value == null ? '—' : `$${Number(value).toFixed(value < 0.01 ? 5 : 4)}`);

export const seconds = (value) => {
  if (value == null || Number.isNaN(value)) return '—';
  if (value < 0.01) return '<0.01 s';
  return value < 60 ? `${value.toFixed(2)} s` : `${Math.floor(value / 60)} min ${Math.round(value % 60)} s`;
};

/** A unix time as a local time of day, and how long ago. */
export const when = (ts) => {
  if (!ts) return '';
  const ago = Math.max(0, Date.now() / 1000 - ts);
  const span = ago < 60 ? `${Math.round(ago)} s` : ago < 3600 ? `${Math.round(ago / 60)} min` : `${(ago / 3600).toFixed(1)} h`;
  return `${new Date(ts * 1000).toLocaleTimeString()} (${span} ago)`;
};

export const statusBadge = (status) => el('span', { class: `status ${status}`, testid: 'status', 'data-status': status }, status.replaceAll('_', ' '));

export const TERMINAL = new Set(['completed', 'failed', 'cancelled']);

export const turnLink = (turnId) => el('a', { href: `#/turn/${encodeURIComponent(turnId)}`, class: 'mono', testid: 'turn-link' }, turnId);

/** Arguments as name = value lines. */
export function argsList(args) {
  const box = el('div', { class: 'mono', testid: 'args' });
  for (const [name, value] of Object.entries(args || {})) {
    box.append(el('div', {}, el('span', { class: 'meta' }, `${name} = `), typeof value === 'string' ? value : JSON.stringify(value)));
  }
  return box;
}
