// The router's charts, cards and tables: replicas, health, placement decisions, index size.
import { el } from './dom.js';
import { clock, fmt, pct } from './format.js';
import { panel, table } from './tables.js';

function replicaNames(samples) {
  const names = new Set();
  for (const s of samples) for (const name of Object.keys(s.replicas || {})) names.add(name);
  return [...names];
}

export const ROUTER_CHARTS = [
  { id: 'chart-in-flight', title: 'In flight per replica', digits: 0, series: (samples) => [
    ...replicaNames(samples).map((name) => ({ label: name, get: (s) => s.replicas?.[name]?.in_flight ?? null })),
    { label: 'queued (router)', get: (s) => s.queued }] },
  { id: 'chart-decisions', title: 'Placement decisions by reason', unit: '/s', series: (samples) => {
    const reasons = new Set();
    for (const s of samples) for (const r of Object.keys(s.decisions_ps || {})) reasons.add(r);
    return [...reasons].map((r) => ({ label: r, get: (s) => s.decisions_ps?.[r] ?? 0 }));
  } },
  { id: 'chart-index', title: 'Index size per replica (blocks, all tiers)', digits: 0, series: (samples) =>
    replicaNames(samples).map((name) => ({ label: name, get: (s) => {
      const blocks = s.replicas?.[name]?.index_blocks;
      return blocks ? Object.values(blocks).reduce((a, b) => a + b, 0) : null;
    } })) },
  { id: 'chart-router-ttft', title: 'Router TTFT percentiles (last window)', unit: 'ms', digits: 0, series:
    ['p50', 'p90', 'p99'].map((p) => ({ label: p, get: (s) => s.ttft_ms?.[p] ?? null })) },
];

export function routerCards(last) {
  const replicas = Object.values(last.replicas || {});
  return [
    ['replicas healthy', `${replicas.filter((r) => r.healthy).length} / ${replicas.length}`],
    ['queued', fmt(last.queued, 0)],
    ['requests/s', fmt(last.requests_ps)],
    ['predicted hit rate', pct(last.predicted_hit_rate)],
    ['TTFT p50 / p99 ms', `${fmt(last.ttft_ms?.p50, 0)} / ${fmt(last.ttft_ms?.p99, 0)}`],
    ['decision p99 ms', fmt(last.decision_ms?.p99, 2)],
  ];
}

export function routerPanels(details) {
  const replicas = table('replicas', ['replica', 'health', 'events', 'in flight', 'index: device',
    'host', 'disk', 'approx blocks', 'last error'], details.replicas.map((r) => [
    r.name,
    el('span', { class: r.healthy ? 'ok' : 'down' }, r.healthy ? 'healthy' : 'down'),
    r.events, r.in_flight, r.index_blocks.device ?? 0, r.index_blocks.host ?? 0,
    r.index_blocks.disk ?? 0, r.approx_blocks, r.last_error || '',
  ]));
  const decisions = table('decisions', ['time', 'replica', 'reason', 'hit / prompt blocks',
    'attempt', 'request'], [...details.decisions].reverse().slice(0, 30).map((d) => [
    clock(d.t), d.replica, d.reason, `${d.hit_blocks} / ${d.prompt_blocks}`, d.attempt, d.request_id,
  ]));
  return [panel(`Replicas (policy: ${details.policy})`, replicas),
    panel('Latest placement decisions', decisions)];
}
