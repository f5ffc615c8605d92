// Builds DOM nodes. Text always goes in as text nodes (never parsed as HTML), so nothing
// the server or the model returns can become markup through here.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === 'class') node.className = value;
    else if (name.startsWith('on')) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? '' : String(value));
  }
  append(node, children);
  return node;
}

export function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

export function svg(tag, attrs = {}) {
  const node = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  return node;
}

export const $ = (id) => document.getElementById(id);

export function show(node, visible) {
  node.classList.toggle('hidden', !visible);
}

export function banner(text) {
  const node = $('banner');
  node.textContent = text || '';
  show(node, Boolean(text));
}
