// Conversations and settings kept in this browser (localStorage); nothing is stored on the
// server.
const CONVERSATIONS = 'tokenmill.conversations';
const SETTINGS = 'tokenmill.settings';

function load(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value ?? fallback;
  } catch {
    return fallback;
  }
}

export class Store {
  constructor() {
    this.conversations = load(CONVERSATIONS, []).filter((c) => c && Array.isArray(c.messages));
    this.settings = load(SETTINGS, {});
  }

  save() {
    localStorage.setItem(CONVERSATIONS, JSON.stringify(this.conversations));
  }

  saveSettings(settings) {
    this.settings = settings;
    localStorage.setItem(SETTINGS, JSON.stringify(settings));
  }

  create(system = '') {
    const conversation = {
      id: crypto.randomUUID ? crypto.randomUUID() : String(Date.now() + Math.random()),
      title: 'New chat',
      created: Date.now(),
      system,
      messages: [],
    };
    this.conversations.unshift(conversation);
    this.save();
    return conversation;
  }

  get(id) {
    return this.conversations.find((c) => c.id === id);
  }

  remove(id) {
    this.conversations = this.conversations.filter((c) => c.id !== id);
    this.save();
  }
}
