// The operations dashboard: polls /ui/api/series (the server's own sampled metrics) and,
// for a router, its replicas and decisions; with the gateway and the admin key, the keys,
// spend and audit logs.
import { askForKey, ensureKey, getJSON, Unauthorized, withKey } from './api.js';
import { $, banner, el } from './dom.js';
import { clock } from './format.js';
import { gatewayPanels } from './gateway_panels.js';
import { LineChart } from './plot.js';
import { ROUTER_CHARTS, routerCards, routerPanels } from './router_charts.js';
import { SERVER_CHARTS, serverCards } from './server_charts.js';

const DETAILS_EVERY = 2; // polls between two reads of the tables
let samples = [];
let config = null;
let info = null;
let charts = [];
let polls = 0;

function setup() {
  const router = info.kind === 'router';
  const specs = router ? ROUTER_CHARTS : SERVER_CHARTS;
  charts = specs.map((spec) => new LineChart($('charts'), spec));
  document.title = `tokenmill · ${router ? 'router ' : ''}dashboard`;
}

function draw() {
  const span = Number($('span').value);
  const now = samples.length ? samples[samples.length - 1].t : Date.now() / 1000;
  for (const chart of charts) chart.update(samples, span, now);
  const last = samples[samples.length - 1];
  if (last) {
    const cards = info.kind === 'router' ? routerCards(last) : serverCards(last);
    $('cards').replaceChildren(...cards.map(([label, value]) =>
      el('div', { class: 'card' }, el('div', { class: 'value' }, value), el('div', { class: 'label' }, label))));
    $('status').textContent = `updated ${clock(last.t)} · every ${config.interval_s} s · rates over ${config.rate_s} s, percentiles over ${config.window_s} s`;
  }
}

async function panels() {
  const out = [];
  if (info.kind === 'router') out.push(...routerPanels(await getJSON('api/details')));
  if (info.gateway && info.admin) out.push(...await gatewayPanels());
  else if (info.gateway) out.push(el('p', { class: 'text' }, 'Keys, spend and audit logs: sign in with the gateway\'s admin key.'));
  $('panels').replaceChildren(...out);
}

async function poll() {
  const since = samples.length ? samples[samples.length - 1].t : null;
  const reply = await getJSON(since === null ? 'api/series' : `api/series?since=${since}`);
  config = reply;
  samples = samples.concat(reply.samples);
  const oldest = (samples.length ? samples[samples.length - 1].t : 0) - reply.keep_s;
  samples = samples.filter((s) => s.t >= oldest);
  draw();
  if (polls++ % DETAILS_EVERY === 0) await panels();
  document.body.dataset.polls = String(polls);
}

async function loop() {
  try {
    await poll();
    banner('');
  } catch (e) {
    if (e instanceof Unauthorized) {
      await askForKey(`The server refused the key: ${e.message}`);
      info = await withKey(() => getJSON('api/info'));
    } else {
      banner(`The dashboard lost the server: ${e.message}`);
    }
  }
  setTimeout(loop, (config?.interval_s ?? 1) * 1000);
}

async function start() {
  info = await withKey(() => getJSON('api/info'));
  setup();
  polls = 0;
  await loop();
}

async function main() {
  $('span').addEventListener('change', draw);
  await ensureKey(async () => {
    info = await withKey(() => getJSON('api/info'));
    await panels();
  });
  await start();
  document.body.dataset.ready = 'true';
}

main().catch((e) => banner(`The dashboard could not start: ${e.message}`));
