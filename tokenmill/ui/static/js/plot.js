// A small SVG line chart for time series (no library): one polyline per series, a y axis
// from 0 to a rounded maximum, the time axis ending now. Colours come from theme.css
// (classes s1..s6), so the charts match the bench report's plots.
import { el, svg } from './dom.js';
import { fmt } from './format.js';

const H = 150;
const PAD = { left: 44, right: 8, top: 8, bottom: 18 };

function niceMax(value) {
  if (!(value > 0)) return 1;
  const magnitude = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) if (value <= step * magnitude) return step * magnitude;
  return 10 * magnitude;
}

export class LineChart {
  // series: [{label, get(sample) -> number|null}] or a function of the samples returning it
  constructor(parent, { id, title, unit = '', series, percent = false, digits = 1 }) {
    this.series = series;
    this.unit = unit;
    this.percent = percent;
    this.digits = digits;
    this.svg = svg('svg', { viewBox: `0 0 400 ${H}`, role: 'img' });
    this.legend = el('div', { class: 'legend' });
    this.node = el('div', { class: 'chart', id }, el('h3', {}, title), this.svg, this.legend);
    parent.append(this.node);
  }

  format(value) {
    if (value === null || value === undefined) return '–';
    return this.percent ? `${fmt(value * 100, 1)}%` : `${fmt(value, this.digits)}${this.unit ? ` ${this.unit}` : ''}`;
  }

  tick(value) {
    if (this.percent) return `${fmt(value * 100, 0)}%`;
    return fmt(value, Number.isInteger(value) ? 0 : 2);
  }

  update(samples, spanSeconds, now) {
    const W = Math.max(200, Math.round(this.svg.getBoundingClientRect().width) || 400);
    this.svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
    const series = typeof this.series === 'function' ? this.series(samples) : this.series;
    const start = now - spanSeconds;
    const shown = samples.filter((s) => s.t >= start);
    const lines = series.map((s) => shown.map((sample) => [sample.t, s.get(sample)]));
    const values = lines.flat().map(([, v]) => v).filter((v) => typeof v === 'number' && Number.isFinite(v));
    const max = this.percent ? Math.max(1, ...values) : niceMax(Math.max(0, ...values));
    const x = (t) => PAD.left + ((t - start) / spanSeconds) * (W - PAD.left - PAD.right);
    const y = (v) => H - PAD.bottom - (v / max) * (H - PAD.top - PAD.bottom);
    const nodes = [];
    for (const fraction of [0, 0.5, 1]) {
      const yy = y(max * fraction);
      nodes.push(svg('line', { class: fraction ? 'gridline' : 'axis', x1: PAD.left, x2: W - PAD.right, y1: yy, y2: yy }));
      const label = svg('text', { x: PAD.left - 4, y: yy + 3, 'text-anchor': 'end' });
      label.textContent = this.tick(max * fraction);
      nodes.push(label);
    }
    for (const [text, anchor, xx] of [[`-${Math.round(spanSeconds / 60)} min`, 'start', PAD.left], ['now', 'end', W - PAD.right]]) {
      const label = svg('text', { x: xx, y: H - 4, 'text-anchor': anchor });
      label.textContent = text;
      nodes.push(label);
    }
    lines.forEach((points, i) => {
      const segments = [];
      let segment = [];
      for (const [t, v] of points) {
        if (typeof v === 'number' && Number.isFinite(v)) segment.push(`${x(t).toFixed(1)},${y(v).toFixed(1)}`);
        else if (segment.length) {
          segments.push(segment);
          segment = [];
        }
      }
      if (segment.length) segments.push(segment);
      for (const seg of segments) {
        const pts = seg.length === 1 ? [seg[0], seg[0]] : seg;
        nodes.push(svg('polyline', { class: `s${(i % 6) + 1}`, points: pts.join(' ') }));
      }
    });
    this.svg.replaceChildren(...nodes);
    const last = shown[shown.length - 1];
    this.legend.replaceChildren(...series.map((s, i) =>
      el('span', { class: `s${(i % 6) + 1}` }, el('span', { class: 'swatch' }),
        el('span', { class: 'name' }, `${s.label} ${last ? this.format(s.get(last)) : '–'}`))));
    this.node.dataset.points = String(shown.length);
    this.node.dataset.max = String(values.length ? Math.max(...values) : 0);
  }
}
