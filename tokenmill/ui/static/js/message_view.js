// One chat message on the page. Assistant text goes through the sanitising markdown
// renderer, user text is plain text; tool calls and stats are built as text nodes.
import { el } from './dom.js';
import { fmt } from './format.js';
import { renderMarkdown } from './markdown.js';

function prettyArguments(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

function statsLine(message) {
  const s = message.stats || {};
  const u = message.usage || {};
  const cached = u.prompt_tokens_details?.cached_tokens;
  const items = [
    ['ttft', s.ttft_ms === null || s.ttft_ms === undefined ? null : `TTFT ${fmt(s.ttft_ms, 0)} ms`],
    ['tps', s.tokens_per_s ? `${fmt(s.tokens_per_s)} tok/s` : null],
    ['prompt', u.prompt_tokens === undefined ? null : `prompt ${u.prompt_tokens}`],
    ['cached', cached === undefined ? null : `cached ${cached}`],
    ['completion', u.completion_tokens === undefined ? null : `completion ${u.completion_tokens}`],
    ['finish', message.finish_reason ? `finish: ${message.finish_reason}` : null],
  ];
  return items.filter(([, text]) => text).map(([name, text]) => el('span', { class: `stat-${name}` }, text));
}

export function renderMessage(node, message) {
  node.className = `msg ${message.role}${message.error ? ' failed' : ''}`;
  const body = el('div', { class: message.role === 'assistant' ? 'body markdown' : 'body plain' });
  if (message.role === 'assistant') renderMarkdown(body, message.content || '');
  else body.textContent = message.content || '';
  const calls = (message.tool_calls || []).map((call) =>
    el('div', { class: 'tool-call' },
      el('b', {}, call.function?.name || '(unnamed)'), '(', prettyArguments(call.function?.arguments || ''), ')'));
  const children = [el('header', {}, message.role), body, ...calls];
  if (message.error) children.push(el('p', { class: 'error' }, message.error));
  if (message.role === 'assistant' && (message.stats || message.usage)) {
    children.push(el('footer', { class: 'stats' }, statsLine(message)));
  }
  node.replaceChildren(...children);
  return node;
}

export function messageNode(message) {
  return renderMessage(el('article'), message);
}
