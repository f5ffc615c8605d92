// One streamed chat completion: accumulates the text, the tool calls (by index), usage
// (stream_options.include_usage) and the finish reason, and times the first token.
import { authHeaders, errorMessage, Unauthorized } from './api.js';
import { events } from './sse.js';

export function mergeToolCalls(calls, deltas) {
  for (const d of deltas || []) {
    const i = d.index ?? calls.length;
    const call = calls[i] || (calls[i] = { id: '', type: 'function', function: { name: '', arguments: '' } });
    if (d.id) call.id = d.id;
    if (d.type) call.type = d.type;
    if (d.function?.name) call.function.name += d.function.name;
    if (d.function?.arguments) call.function.arguments += d.function.arguments;
  }
  return calls;
}

// `message` is updated in place; `onUpdate()` runs after every chunk.
export async function streamChat(body, message, onUpdate, signal) {
  const started = performance.now();
  let firstToken = null;
  const response = await fetch('../v1/chat/completions', {
    method: 'POST',
    headers: authHeaders({ 'Content-Type': 'application/json' }),
    body: JSON.stringify(body),
    signal,
  });
  if (response.status === 401) throw new Unauthorized(await errorMessage(response));
  if (!response.ok) throw new Error(await errorMessage(response));
  message.content = '';
  message.tool_calls = [];
  for await (const chunk of events(response)) {
    if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
    for (const choice of chunk.choices || []) {
      const delta = choice.delta || {};
      if (delta.content || delta.tool_calls?.length) {
        firstToken ??= performance.now();
        message.content += delta.content || '';
        mergeToolCalls(message.tool_calls, delta.tool_calls);
      }
      if (choice.finish_reason) message.finish_reason = choice.finish_reason;
    }
    if (chunk.usage) message.usage = chunk.usage;
    onUpdate();
  }
  const ended = performance.now();
  const completion = message.usage?.completion_tokens ?? 0;
  message.stats = {
    ttft_ms: firstToken === null ? null : firstToken - started,
    tokens_per_s:
      firstToken !== null && completion > 1 && ended > firstToken
        ? (completion - 1) / ((ended - firstToken) / 1000)
        : null,
    latency_ms: ended - started,
  };
  if (!message.tool_calls.length) delete message.tool_calls;
  onUpdate();
  return message;
}
