// Plain tables whose cells are text nodes (or given nodes): safe for any server data.
import { el } from './dom.js';

export function table(id, head, rows) {
  const cell = (c) => (c instanceof Node
    ? el('td', {}, c)
    : el('td', { class: typeof c === 'number' ? '' : 'text' }, c ?? '–'));
  return el('table', { id },
    el('thead', {}, el('tr', {}, head.map((h) => el('th', {}, h)))),
    el('tbody', {}, rows.length
      ? rows.map((cells) => el('tr', {}, cells.map(cell)))
      : el('tr', {}, el('td', { colspan: head.length, class: 'text' }, 'none yet'))));
}

export const panel = (title, ...children) => el('section', { class: 'panel' }, el('h2', {}, title), ...children);
