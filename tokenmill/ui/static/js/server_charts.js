// The engine server's charts and headline cards (from /ui/api/series samples).
import { fmt, pct } from './format.js';

const pick = (path) => (s) => path.split('.').reduce((v, k) => (v == null ? null : v[k]), s);
const PERCENTILES = ['p50', 'p90', 'p99'];

export const SERVER_CHARTS = [
  { id: 'chart-requests', title: 'Requests', digits: 0, series: [
    { label: 'running', get: pick('running') }, { label: 'waiting', get: pick('waiting') }] },
  { id: 'chart-kv', title: 'KV cache usage per tier', percent: true, series: (samples) => {
    const tiers = new Set();
    for (const s of samples) for (const tier of Object.keys(s.kv_usage || {})) tiers.add(tier);
    return [...tiers].map((tier) => ({ label: tier, get: pick(`kv_usage.${tier}`) }));
  } },
  { id: 'chart-prefix', title: 'Prefix cache hit rate (tokens, last window)', percent: true, series: [
    { label: 'hit rate', get: pick('prefix_hit_rate') }] },
  { id: 'chart-throughput', title: 'Throughput', unit: 'tok/s', series: [
    { label: 'output', get: pick('output_tps') }, { label: 'prompt', get: pick('prompt_tps') }] },
  { id: 'chart-ttft', title: 'TTFT percentiles (last window)', unit: 'ms', digits: 0, series:
    PERCENTILES.map((p) => ({ label: p, get: pick(`ttft_ms.${p}`) })) },
  { id: 'chart-itl', title: 'Inter-token latency percentiles (last window)', unit: 'ms', series:
    PERCENTILES.map((p) => ({ label: p, get: pick(`itl_ms.${p}`) })) },
  { id: 'chart-events', title: 'Preemptions and loop cut-offs', unit: '/s', digits: 2, series: [
    { label: 'preemptions', get: pick('preemptions_ps') }, { label: 'loop cut-offs', get: pick('loop_cutoffs_ps') }] },
];

export function serverCards(last) {
  return [
    ['running', fmt(last.running, 0)],
    ['waiting', fmt(last.waiting, 0)],
    ['KV (device)', pct(last.kv_usage?.device)],
    ['prefix hit rate', pct(last.prefix_hit_rate)],
    ['output tok/s', fmt(last.output_tps)],
    ['TTFT p50 / p99 ms', `${fmt(last.ttft_ms?.p50, 0)} / ${fmt(last.ttft_ms?.p99, 0)}`],
    ['ITL p50 / p99 ms', `${fmt(last.itl_ms?.p50)} / ${fmt(last.itl_ms?.p99)}`],
    ['requests done', fmt(last.totals?.requests, 0)],
  ];
}
