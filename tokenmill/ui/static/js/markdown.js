// Markdown for model output, which is untrusted: raw HTML in it is shown as text (never
// parsed), images become text (no requests to other hosts), and the HTML marked produces is
// then sanitised by DOMPurify down to a small set of tags and attributes before it reaches
// the page, as a DOM fragment.
import { Marked } from '../vendor/marked/marked.esm.js';
import DOMPurify from '../vendor/dompurify/purify.es.mjs';

const ESCAPES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
const escapeHTML = (text) => String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);

const marked = new Marked({
  gfm: true,
  breaks: true,
  async: false,
  renderer: {
    html: (token) => escapeHTML(token.raw ?? token.text),
    image: (token) => escapeHTML(token.raw ?? token.text),
  },
});

const ALLOWED_TAGS = [
  'a', 'blockquote', 'br', 'code', 'del', 'em', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'hr', 'li',
  'ol', 'p', 'pre', 'strong', 'table', 'tbody', 'td', 'th', 'thead', 'tr', 'ul', 'input',
];
const ALLOWED_ATTR = ['href', 'title', 'start', 'align', 'type', 'checked', 'disabled'];

DOMPurify.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'A') {
    node.setAttribute('target', '_blank');
    node.setAttribute('rel', 'noopener noreferrer nofollow');
  }
  if (node.tagName === 'INPUT' && node.getAttribute('type') !== 'checkbox') node.remove();
});

export function markdownFragment(text) {
  return DOMPurify.sanitize(marked.parse(text || ''), {
    ALLOWED_TAGS,
    ALLOWED_ATTR,
    ALLOWED_URI_REGEXP: /^(?:https?:|mailto:)/i,
    RETURN_DOM_FRAGMENT: true,
  });
}

export function renderMarkdown(target, text) {
  target.replaceChildren(markdownFragment(text));
}
