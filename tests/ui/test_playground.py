"""The chat playground in Chromium against a real server (embedded model): streamed text,
stats, tool calls, request snippets, and model output that tries to be HTML."""

from __future__ import annotations

import json
import re

from playwright.sync_api import expect

from tests.ui.browser import screenshot
from tests.ui.conftest import KEY, open_ui

ASSISTANT = "#messages article.assistant"
# Counts the assistant text's length at every DOM change while a reply streams in.
# a reply of ~64 tokens: long enough to arrive over many chunks on a fast or loaded machine
PROMPT_TEXT = "Write a short story about a lighthouse keeper."
WATCH_LENGTHS = """() => {
  window.__lengths = [];
  new MutationObserver(() => {
    const body = [...document.querySelectorAll('#messages article.assistant .body')].pop();
    if (body) window.__lengths.push(body.textContent.length);
  }).observe(document.getElementById('messages'),
             {childList: true, subtree: true, characterData: true});
}"""


def test_a_reply_streams_in_with_its_stats_and_the_request_copies_as_code(page, ui_server):
    open_ui(page, ui_server.base_url + "/ui")
    assert page.url.endswith("/ui/"), "/ui redirects to ui/ (relative URLs need the slash)"
    expect(page.locator("#model")).to_have_value("SmolLM2-135M-Instruct")
    page.fill("#system", "You are terse.")
    page.fill("#temperature", "0")
    page.fill("#max_tokens", "64")
    page.fill("#seed", "7")
    page.evaluate(WATCH_LENGTHS)
    page.fill("#prompt", PROMPT_TEXT)
    page.press("#prompt", "Enter")
    stats = page.locator(f"{ASSISTANT} footer.stats")
    expect(stats.locator(".stat-finish")).to_be_visible(timeout=90_000)

    lengths = page.evaluate("window.__lengths")
    grown = [n for i, n in enumerate(lengths) if n > 0 and (i == 0 or n != lengths[i - 1])]
    assert len(set(grown)) >= 3, f"the text must grow while it streams, saw lengths {lengths}"
    assert grown == sorted(grown), f"streamed text only grows: {grown}"
    assert page.locator(f"{ASSISTANT} .body").inner_text().strip()
    expect(stats.locator(".stat-ttft")).to_have_text(re.compile(r"TTFT [\d,]+ ms"))
    expect(stats.locator(".stat-tps")).to_contain_text("tok/s")
    expect(stats.locator(".stat-prompt")).to_have_text(re.compile(r"prompt \d+"))
    expect(stats.locator(".stat-cached")).to_have_text(re.compile(r"cached \d+"))
    expect(stats.locator(".stat-completion")).to_have_text(re.compile(r"completion \d+"))
    expect(stats.locator(".stat-finish")).to_have_text(re.compile(r"finish: (stop|length)"))
    screenshot(page, "ui-playground")

    # kept in this browser: a reload shows the same conversation
    stored = page.evaluate("JSON.parse(localStorage.getItem('tokenmill.conversations'))")
    assert stored[0]["messages"][0]["content"] == PROMPT_TEXT
    assert stored[0]["system"] == "You are terse."

    page.click("#copy-python")
    python = page.locator("#snippet").inner_text()
    assert f"{ui_server.base_url}/v1" in python and "TOKENMILL_API_KEY" in python
    assert '"seed": 7' in python and f'"{PROMPT_TEXT}"' in python
    page.click("#copy-curl")
    curl = page.locator("#snippet").inner_text()
    assert curl.startswith(f"curl -N {ui_server.base_url}/v1/chat/completions")
    body = json.loads(curl.split("<<'JSON'\n", 1)[1].rsplit("\nJSON", 1)[0])
    assert body["messages"][0] == {"role": "system", "content": "You are terse."}
    assert body["stream_options"] == {"include_usage": True} and body["max_tokens"] == 64
    assert KEY not in curl + python, "the key never goes into a snippet"

    page.reload()
    page.wait_for_selector("body[data-ready=true]")  # the key stays for this tab
    expect(page.locator(ASSISTANT)).to_have_count(1)
    expect(page.locator("#messages article.user")).to_have_text(re.compile("lighthouse keeper"))


def test_tool_mode_shows_the_parsed_tool_call(page, ui_server):
    open_ui(page, ui_server.base_url + "/ui/")
    page.click("#new-conversation")
    page.select_option("#mode", "tools")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"], "additionalProperties": False}}}]  # fmt: skip
    page.fill("#tools", json.dumps(tools))
    page.select_option("#tool_choice", "required")
    page.fill("#temperature", "0")
    page.fill("#max_tokens", "40")
    page.fill("#prompt", "What is the weather in Paris?")
    page.click("#send")
    expect(page.locator(f"{ASSISTANT} .stat-finish")).to_have_text(
        "finish: tool_calls", timeout=90_000
    )
    call = page.locator(f"{ASSISTANT} .tool-call")
    expect(call).to_have_count(1)
    text = call.inner_text()
    assert text.startswith("get_weather(")
    args = json.loads(text[len("get_weather(") : -1])
    assert args["city"] in ("Paris", "Rome")


HOSTILE = [
    "Hello <script>window.__pwned = 1</script>",
    ' <img src=x onerror="window.__pwned = 2">',
    ' and **bold** with [a link](javascript:window.__pwned=3) and <b onclick="x()">b</b>',
    '\n\n<iframe src="https://example.com"></iframe>\n\n![pic](https://example.com/a.png)',
]


def _fake_stream() -> str:
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    chunks += [{"choices": [{"index": 0, "delta": {"content": part}}]} for part in HOSTILE]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    usage = {"prompt_tokens": 9, "completion_tokens": 30, "total_tokens": 39,
             "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
    chunks.append({"choices": [], "usage": usage})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def test_model_output_that_looks_like_html_is_shown_as_text(page, ui_server):
    """The reply comes through the page's own streaming path and renderer (the server's
    answer replaced on the wire). Were the renderer to put the model's text in as HTML,
    unsanitised, the <img>, <script> and <iframe> would be elements here and the test fails."""
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200, headers={"content-type": "text/event-stream"}, body=_fake_stream()
        ),
    )
    open_ui(page, ui_server.base_url + "/ui/")
    page.click("#new-conversation")
    page.fill("#prompt", "say something dangerous")
    page.click("#send")
    expect(page.locator(f"{ASSISTANT} .stat-finish")).to_be_visible(timeout=30_000)

    def check() -> None:
        body = page.locator(f"{ASSISTANT} .body")
        text = body.inner_text()
        assert "<script>window.__pwned = 1</script>" in text
        assert '<img src=x onerror="window.__pwned = 2">' in text
        assert '<iframe src="https://example.com"></iframe>' in text
        assert body.locator("script, img, iframe, b[onclick], [onerror]").count() == 0
        assert body.locator("a[href^='javascript']").count() == 0
        expect(body.locator("strong")).to_have_text("bold")  # markdown still renders
        assert page.evaluate("window.__pwned") is None

    check()
    page.reload()  # the stored conversation renders through the same function
    page.wait_for_selector("body[data-ready=true]")
    check()
