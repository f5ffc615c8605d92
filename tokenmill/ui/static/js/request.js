// The chat request the playground sends, from its settings and a conversation's messages.
const NUMBER_KNOBS = ['temperature', 'top_p', 'top_k', 'max_tokens', 'presence_penalty',
  'frequency_penalty', 'seed'];

export class SettingsError extends Error {}

function parseJSON(text, what) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new SettingsError(`${what}: ${e.message}`);
  }
}

// What the API takes for one stored message (stats and timings stay in the browser).
export function apiMessage(message) {
  const out = { role: message.role, content: message.content ?? '' };
  if (message.tool_calls?.length) {
    out.tool_calls = message.tool_calls;
    if (!message.content) out.content = null;
  }
  return out;
}

export function chatBody(settings, conversation, stream = true) {
  const messages = [];
  if (conversation.system?.trim()) messages.push({ role: 'system', content: conversation.system });
  for (const m of conversation.messages) if (!m.error) messages.push(apiMessage(m));
  const body = { model: settings.model, messages };
  for (const name of NUMBER_KNOBS) {
    const raw = settings[name];
    if (raw === '' || raw === undefined || raw === null) continue;
    const value = Number(raw);
    if (!Number.isFinite(value)) throw new SettingsError(`${name}: not a number`);
    body[name] = value;
  }
  const stop = (settings.stop_sequences || '').split('\n').filter((s) => s.length > 0);
  if (stop.length) body.stop = stop;
  if (settings.mode === 'json_schema') {
    const schema = parseJSON(settings.schema || '', 'JSON schema');
    body.response_format = {
      type: 'json_schema',
      json_schema: { name: 'playground', schema, strict: true },
    };
  } else if (settings.mode === 'tools') {
    const tools = parseJSON(settings.tools || '', 'tools');
    if (!Array.isArray(tools)) throw new SettingsError('tools: must be a JSON array');
    body.tools = tools;
    body.tool_choice = settings.tool_choice || 'auto';
  }
  if (stream) {
    body.stream = true;
    body.stream_options = { include_usage: true };
  }
  return body;
}
