// The playground's request as a command or a script. The key is never written into them:
// they read $TOKENMILL_API_KEY.

// The API's base URL (…/v1) as this page reaches it, proxy prefix included.
export const apiBase = () => new URL('../v1', window.location.href).href;

export function curlSnippet(body) {
  const json = JSON.stringify(body, null, 2);
  return [
    `curl -N ${apiBase()}/chat/completions \\`,
    '  -H "Authorization: Bearer $TOKENMILL_API_KEY" \\',
    '  -H "Content-Type: application/json" \\',
    "  -d @- <<'JSON'",
    json,
    'JSON',
  ].join('\n');
}

// A JSON value as a Python literal (JSON strings are valid Python strings).
export function pythonLiteral(value, indent = 0) {
  const pad = ' '.repeat(indent + 4);
  const end = ' '.repeat(indent);
  if (value === null || value === undefined) return 'None';
  if (value === true) return 'True';
  if (value === false) return 'False';
  if (typeof value === 'number' || typeof value === 'string') return JSON.stringify(value);
  if (Array.isArray(value)) {
    if (!value.length) return '[]';
    return `[\n${value.map((v) => pad + pythonLiteral(v, indent + 4)).join(',\n')},\n${end}]`;
  }
  const entries = Object.entries(value);
  if (!entries.length) return '{}';
  const items = entries.map(([k, v]) => `${pad}${JSON.stringify(k)}: ${pythonLiteral(v, indent + 4)}`);
  return `{\n${items.join(',\n')},\n${end}}`;
}

export function pythonSnippet(body) {
  const { stream, stream_options: _, ...rest } = body;
  const lines = [
    'import os',
    '',
    'from openai import OpenAI',
    '',
    `client = OpenAI(base_url=${JSON.stringify(apiBase())}, api_key=os.environ.get("TOKENMILL_API_KEY", "none"))`,
    `request = ${pythonLiteral(rest)}`,
  ];
  if (stream) {
    lines.push(
      'stream = client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True})',
      'for chunk in stream:',
      '    if chunk.choices and chunk.choices[0].delta.content:',
      '        print(chunk.choices[0].delta.content, end="", flush=True)',
      '    if chunk.usage:',
      '        print("\\n", chunk.usage)',
    );
  } else {
    lines.push('print(client.chat.completions.create(**request))');
  }
  return lines.join('\n');
}
