// The gateway's keys, spend per key and audit logs (its admin API: the admin key only).
import { getJSON } from './api.js';
import { el } from './dom.js';
import { clock, fmt } from './format.js';
import { panel, table } from './tables.js';

const when = (t) => (t ? `${new Date(t * 1000).toISOString().slice(0, 10)} ${clock(t)}` : '');

export async function gatewayPanels() {
  const [keys, usage, guardrails, tools] = await Promise.all([
    getJSON('../admin/keys?include_revoked=true'),
    getJSON('../admin/usage?group_by=key'),
    getJSON('../admin/guardrail_events?limit=50'),
    getJSON('../admin/tool_call_events?limit=50'),
  ]);
  const names = Object.fromEntries(keys.data.map((k) => [k.id, k.name || k.id]));
  return [
    panel('Gateway keys', table('gateway-keys', ['key', 'name', 'team', 'user', 'models',
      'tool policy', 'budget $', 'created', 'state'], keys.data.map((k) => [
      k.id, k.name, k.team, k.user, k.models ? k.models.join(', ') : 'all', k.tool_policy,
      k.budget_usd === null ? '–' : `${k.budget_usd} / ${k.budget_period}`, when(k.created),
      el('span', { class: k.revoked_at ? 'down' : 'ok' }, k.revoked_at ? 'revoked' : 'live'),
    ]))),
    panel('Spend per key', table('gateway-spend', ['key', 'requests', 'prompt tokens', 'cached',
      'completion tokens', 'cost $'], usage.data.map((u) => [
      names[u.key_id] || u.key_id || '(none)', u.requests, u.prompt_tokens, u.cached_tokens,
      u.completion_tokens, fmt(u.cost_usd, 4),
    ]))),
    panel('Guardrail decisions', table('gateway-guardrails', ['time', 'key', 'stage', 'rule',
      'action', 'matched'], guardrails.data.map((e) => [
      when(e.created), names[e.key_id] || e.key_id, e.stage, e.rule, e.action, e.matched_text,
    ]))),
    panel('Tool-call audit log', table('gateway-tool-calls', ['time', 'key', 'tool', 'arguments',
      'verdict', 'reason'], tools.data.map((e) => [
      when(e.created), names[e.key_id] || e.key_id, e.tool_name, e.arguments,
      el('span', { class: e.allowed ? 'ok' : 'down' }, e.allowed ? 'allowed' : 'refused'), e.reason,
    ]))),
  ];
}
