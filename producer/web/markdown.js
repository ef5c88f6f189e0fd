// Markdown for the model's text, made safe: marked parses it, raw HTML in it is shown as text (never
// parsed as markup), and DOMPurify cleans what marked produced (links keep only http(s)/mailto URLs).
// Used by the chat page and the console; both vendor the libraries from web/vendor/ (no CDN).

import { Marked } from './vendor/marked.esm.js';
import DOMPurify from './vendor/purify.es.mjs';

const escapeHtml = (text) =>
  text.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);

const marked = new Marked({
  gfm: true,
  breaks: true,
  renderer: {
    html: ({ text }) => escapeHtml(text), // the model's inline or block HTML: shown, not run
    image: ({ text }) => escapeHtml(text || ''), // no images fetched from URLs a model chose: their alt text
  },
});

const purifier = DOMPurify(window);
purifier.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'A') {
    node.setAttribute('target', '_blank');
    node.setAttribute('rel', 'noopener noreferrer nofollow');
  }
});

const ALLOWED_TAGS = ['p', 'br', 'strong', 'em', 'del', 'code', 'pre', 'blockquote', 'ul', 'ol', 'li', 'a',
  'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'hr', 'table', 'thead', 'tbody', 'tr', 'th', 'td', 'input'];

/** The element a piece of model text renders to: sanitized Markdown inside a `div.markdown`. */
export function markdown(text, attrs = {}) {
  const box = document.createElement('div');
  box.className = 'markdown';
  for (const [name, value] of Object.entries(attrs)) box.setAttribute(name, value);
  box.innerHTML = purifier.sanitize(marked.parse(text || ''), {
    ALLOWED_TAGS,
    ALLOWED_ATTR: ['href', 'title', 'align', 'type', 'checked', 'disabled', 'class', 'start'],
    ALLOWED_URI_REGEXP: /^(?:https?:|mailto:)/i,
  });
  return box;
}
