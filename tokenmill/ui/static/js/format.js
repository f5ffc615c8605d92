// Number formatting shared by the pages.
export function fmt(value, digits = 1) {
  if (value === null || value === undefined || Number.isNaN(value)) return '–';
  if (typeof value !== 'number') return String(value);
  if (Math.abs(value) >= 1000) return value.toLocaleString('en-US', { maximumFractionDigits: 0 });
  return value.toFixed(Number.isInteger(value) ? 0 : digits);
}

export const pct = (value) => (value === null || value === undefined ? '–' : `${(value * 100).toFixed(1)}%`);

export function clock(epochSeconds) {
  return new Date(epochSeconds * 1000).toLocaleTimeString('en-GB', { hour12: false });
}
