// The chat playground: conversations (kept in localStorage), settings, streaming replies.
import { ensureKey, getJSON, withKey } from './api.js';
import { streamChat } from './chat_stream.js';
import { Store } from './conversations.js';
import { $, banner, el, show } from './dom.js';
import { messageNode, renderMessage } from './message_view.js';
import { chatBody, SettingsError } from './request.js';
import { curlSnippet, pythonSnippet } from './snippets.js';

const FIELDS = ['model', 'temperature', 'top_p', 'top_k', 'max_tokens', 'presence_penalty',
  'frequency_penalty', 'seed', 'stop_sequences', 'mode', 'schema', 'tools', 'tool_choice'];
const EXAMPLE_SCHEMA = {
  type: 'object',
  properties: { answer: { type: 'string' }, confidence: { type: 'number' } },
  required: ['answer', 'confidence'],
  additionalProperties: false,
};
const EXAMPLE_TOOLS = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather in a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
      required: ['city'],
    },
  },
}];

const store = new Store();
let current = null;
let controller = null;

function readSettings() {
  const settings = {};
  for (const name of FIELDS) settings[name] = $(name).value;
  return settings;
}

function writeSettings(settings) {
  for (const name of FIELDS) {
    if (settings[name] !== undefined && name !== 'model') $(name).value = settings[name];
  }
  if (!$('schema').value) $('schema').value = JSON.stringify(EXAMPLE_SCHEMA, null, 2);
  if (!$('tools').value) $('tools').value = JSON.stringify(EXAMPLE_TOOLS, null, 2);
  modeChanged();
}

function modeChanged() {
  show($('schema-settings'), $('mode').value === 'json_schema');
  show($('tool-settings'), $('mode').value === 'tools');
}

function renderList() {
  const items = store.conversations.map((c) =>
    el('li', { class: c === current ? 'current' : '', 'data-id': c.id, onclick: () => select(c.id) },
      el('span', { title: c.title }, c.title),
      el('button', { type: 'button', title: 'Delete', 'aria-label': 'Delete', onclick: (e) => {
        e.stopPropagation();
        remove(c.id);
      } }, '×')));
  $('conversation-list').replaceChildren(...items);
}

function renderConversation() {
  $('system').value = current.system || '';
  $('messages').replaceChildren(...current.messages.map(messageNode));
  renderList();
}

function select(id) {
  if (controller) return;
  current = store.get(id) || store.create();
  renderConversation();
}

function remove(id) {
  store.remove(id);
  if (current?.id === id) current = store.conversations[0] || store.create();
  renderConversation();
}

function busy(on) {
  show($('send'), !on);
  show($('stop'), on);
  $('prompt').disabled = on;
}

function requestBody(pending = null) {
  const error = $('settings-error');
  const messages = pending ? [...current.messages, pending] : current.messages;
  try {
    const body = chatBody(readSettings(), { ...current, messages, system: $('system').value });
    show(error, false);
    return body;
  } catch (e) {
    if (!(e instanceof SettingsError)) throw e;
    error.textContent = e.message;
    show(error, true);
    return null;
  }
}

async function send() {
  const text = $('prompt').value.trim();
  if (!text || controller) return;
  current.system = $('system').value;
  const user = { role: 'user', content: text };
  current.messages.push(user);
  const body = requestBody();
  if (!body) {
    current.messages.pop();
    return;
  }
  if (current.title === 'New chat') current.title = text.slice(0, 40);
  $('prompt').value = '';
  const assistant = { role: 'assistant', content: '' };
  current.messages.push(assistant);
  $('messages').append(messageNode(user));
  const node = messageNode(assistant);
  node.dataset.streaming = 'true';
  $('messages').append(node);
  renderList();
  let scheduled = false;
  const update = () => {
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(() => {
      scheduled = false;
      renderMessage(node, assistant);
      $('messages').scrollTop = $('messages').scrollHeight;
    });
  };
  controller = new AbortController();
  busy(true);
  try {
    await withKey(() => streamChat(body, assistant, update, controller.signal));
  } catch (e) {
    assistant.error = e.name === 'AbortError' ? 'stopped' : e.message;
  } finally {
    controller = null;
    busy(false);
    delete node.dataset.streaming;
    renderMessage(node, assistant);
    store.save();
    $('prompt').focus();
  }
}

async function copySnippet(make) {
  const text = $('prompt').value.trim();
  const body = requestBody(text ? { role: 'user', content: text } : null);
  if (!body) return;
  const snippet = make(body);
  const pre = $('snippet');
  pre.textContent = snippet;
  show(pre, true);
  try {
    await navigator.clipboard.writeText(snippet);
    banner('Copied to the clipboard.');
    setTimeout(() => banner(''), 1500);
  } catch {
    banner('The clipboard is not available here: select the text below and copy it.');
  }
}

async function loadModels() {
  const models = await withKey(() => getJSON('../v1/models'));
  const select = $('model');
  select.replaceChildren(...models.data.map((m) => el('option', { value: m.id }, m.id)));
  if (store.settings.model && models.data.some((m) => m.id === store.settings.model)) {
    select.value = store.settings.model;
  }
  $('status').textContent = `${models.data.length} model${models.data.length === 1 ? '' : 's'}`;
}

async function main() {
  writeSettings(store.settings);
  for (const name of FIELDS) $(name).addEventListener('change', () => store.saveSettings(readSettings()));
  $('mode').addEventListener('change', modeChanged);
  $('system').addEventListener('change', () => {
    current.system = $('system').value;
    store.save();
  });
  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    send();
  });
  $('prompt').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey) {
      e.preventDefault();
      send();
    }
  });
  $('stop').addEventListener('click', () => controller?.abort());
  $('new-conversation').addEventListener('click', () => select(store.create().id));
  $('copy-curl').addEventListener('click', () => copySnippet(curlSnippet));
  $('copy-python').addEventListener('click', () => copySnippet(pythonSnippet));
  current = store.conversations[0] || store.create();
  renderConversation();
  await ensureKey(loadModels);
  await loadModels();
  document.body.dataset.ready = 'true';
}

main().catch((e) => banner(`The playground could not start: ${e.message}`));
