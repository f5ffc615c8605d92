// Calls to this server: relative URLs only (the UI may sit behind a proxy at a sub-path),
// the API key from sessionStorage as `Authorization: Bearer` on every data call.
import { $, show } from './dom.js';

const KEY = 'tokenmill.apiKey';

export class Unauthorized extends Error {}

export class HTTPError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export const apiKey = () => sessionStorage.getItem(KEY) || '';

export function authHeaders(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

export async function errorMessage(response) {
  try {
    const body = await response.json();
    return body?.error?.message || JSON.stringify(body);
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

export async function getJSON(url) {
  const response = await fetch(url, { headers: authHeaders(), cache: 'no-store' });
  if (response.status === 401) throw new Unauthorized(await errorMessage(response));
  if (!response.ok) throw new HTTPError(response.status, await errorMessage(response));
  return response.json();
}

export function askForKey(reason) {
  const dialog = $('key-dialog');
  const error = $('key-error');
  error.textContent = reason || '';
  show(error, Boolean(reason));
  $('key-input').value = '';
  return new Promise((resolve) => {
    const form = $('key-form');
    const submit = (event) => {
      event.preventDefault();
      const key = $('key-input').value.trim();
      if (!key) return;
      sessionStorage.setItem(KEY, key);
      form.removeEventListener('submit', submit);
      dialog.close();
      resolve(key);
    };
    form.addEventListener('submit', submit);
    if (!dialog.open) dialog.showModal();
  });
}

// Asks for a key first when the server needs one and this tab has none; the key button
// lets the user change it later.
export async function ensureKey(onChange) {
  const auth = await (await fetch('auth', { cache: 'no-store' })).json();
  const button = $('key-button');
  show(button, auth.key_required);
  button.addEventListener('click', async () => {
    await askForKey('');
    onChange?.();
  });
  if (auth.key_required && !apiKey()) await askForKey('');
  return auth.key_required;
}

// Runs `call`, asking for a (new) key and retrying while the server answers 401.
export async function withKey(call) {
  for (;;) {
    try {
      return await call();
    } catch (e) {
      if (!(e instanceof Unauthorized)) throw e;
      await askForKey(`The server refused the key: ${e.message}`);
    }
  }
}
