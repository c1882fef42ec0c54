"""lib.js's polling and streaming, run in Chromium on a page of the server's origin with
`fetch` and `setTimeout` replaced in the page (no page module runs there): how long a
poller waits after each kind of failure, that its notice is written once and cleared by a
success, that a 429's Retry-After reaches ApiError, and that a stream cut off before
`[DONE]` is an error and a stream left early is cancelled."""

from __future__ import annotations

from typing import Any

from playwright.async_api import Page

from tests.ui.conftest import Tab

# An empty page of the same origin (the JSON of /healthz): lib.js is imported by itself,
# with the live region it writes to.
SETUP = """async () => {
  const region = document.createElement("div");
  region.id = "notice";
  document.body.append(region);
  window.lib = await import("/ui/static/lib.js");
}"""

POLL = """async () => {
  const { ApiError, poll } = window.lib;
  const region = document.getElementById("notice");
  let writes = 0;
  new MutationObserver((records) => { writes += records.length; })
    .observe(region, { childList: true, characterData: true, subtree: true });
  const delays = [];
  const realSetTimeout = window.setTimeout.bind(window);
  window.setTimeout = (callback, ms) => { delays.push(ms); return realSetTimeout(callback, 0); };
  const outcomes = [
    new ApiError(429, "slow down", "rate_limit_exceeded", "requests", 7),
    new TypeError("Failed to fetch"),
    new ApiError(503, "busy"), new ApiError(503, "busy"), new ApiError(503, "busy"), new ApiError(503, "busy"),
    null,
    new ApiError(403, "not yours"),
    new TypeError("Failed to fetch"),
    null,
  ];
  const seen = []; // before each run: what the notice says, and how often it was written
  // A poller that never gets there fails the test rather than hanging it.
  const within = (promise) => Promise.race([promise, new Promise((_, fail) =>
    realSetTimeout(() => fail(new Error(`stuck after ${delays.length} runs`)), 10000))]);
  let poller;
  await within(new Promise((done) => {
    let run = 0;
    poller = poll(async () => {
      seen.push([region.textContent, writes]);
      const outcome = outcomes[run++];
      if (run === outcomes.length) { poller.stop(); done(); }
      if (outcome) throw outcome;
    }, 2000);
  }));
  // now() during a run: the next run comes at once after it, not two at a time.
  const nowDelays = [];
  window.setTimeout = (callback, ms) => { nowDelays.push(ms); return realSetTimeout(callback, 0); };
  let runs = 0;
  let overlapping = false;
  let inside = false;
  await within(new Promise((done) => {
    const second = poll(async () => {
      overlapping ||= inside;
      inside = true;
      runs += 1;
      if (runs === 1) second.now();
      await new Promise((resolve) => realSetTimeout(resolve, 5));
      inside = false;
      if (runs === 2) { second.stop(); done(); }
    }, 2000);
  }));
  window.setTimeout = realSetTimeout;
  return { delays, seen, final: region.textContent, nowDelays, overlapping };
}"""


def page_of(tab: Tab) -> Page:
    return tab.page


async def lib_page(tab: Tab) -> Page:
    page = page_of(tab)
    await page.route("**/favicon.ico", lambda route: route.fulfill(status=204))  # the server has none
    await page.goto(f"{tab.base_url}/healthz")
    await page.evaluate(SETUP)
    return page


async def test_poll_waits_as_asked_backs_off_and_clears_its_notice(tab: Tab) -> None:
    result: dict[str, Any] = await (await lib_page(tab)).evaluate(POLL)
    # The first run at once; 7 s as Retry-After asked; then 2 s doubling per failure in a row
    # (4, 8, 16, capped at 30); 2 s after a success; a 403 is no reason to slow down.
    assert result["delays"] == [0, 7000, 4000, 8000, 16000, 30000, 30000, 2000, 2000, 4000]
    texts = [text for text, _ in result["seen"]]
    failed = "Failed to fetch"
    assert texts == ["", "slow down", failed, "busy", "busy", "busy", "busy", "", "not yours", failed]
    writes = [count for _, count in result["seen"]]
    assert writes[3] == writes[6], "the same message was written again"
    assert result["final"] == ""  # the last success cleared it
    assert result["nowDelays"] == [0, 0] and not result["overlapping"]


async def test_api_errors_carry_retry_after(tab: Tab) -> None:
    retry_after = await (await lib_page(tab)).evaluate("""async () => {
      const answer = (status, headers) => async () => new Response(
        JSON.stringify({ error: { message: "Rate limit reached", code: "rate_limit_exceeded", type: "requests" } }),
        { status, headers: { "Content-Type": "application/json", ...headers } });
      const caught = [];
      for (const headers of [{ "Retry-After": "7" }, {}]) {
        window.fetch = answer(429, headers);
        try {
          await window.lib.api("/v1/models");
        } catch (error) {
          caught.push([error.status, error.code, error.retryAfter]);
        }
      }
      return caught;
    }""")
    assert retry_after == [[429, "rate_limit_exceeded", 7], [429, "rate_limit_exceeded", None]]


SSE = """async () => {
  const encode = (text) => new TextEncoder().encode(text);
  const serve = (chunks, { close = true, onCancel = () => {} } = {}) => {
    window.fetch = async () => new Response(new ReadableStream({
      start(controller) {
        for (const chunk of chunks) controller.enqueue(encode(chunk));
        if (close) controller.close();
      },
      cancel: onCancel,
    }), { status: 200, headers: { "Content-Type": "text/event-stream" } });
  };
  const read = async () => {
    const got = [];
    try {
      for await (const event of window.lib.sse("/v1/chat/completions", {})) got.push(event.n);
      return { got, error: null };
    } catch (error) {
      return { got, error: [error.name, error.status, error.message] };
    }
  };
  serve(['data: {"n": 1}\\n\\n', 'data: {"n": 2}\\n\\ndata: [DONE]\\n\\n']);
  const whole = await read();
  serve(['data: {"n": 1}\\n\\n']);
  const cut = await read();
  let cancelled;
  const gone = new Promise((resolve) => { cancelled = resolve; });
  serve(['data: {"n": 1}\\n\\n'], { close: false, onCancel: () => cancelled(true) });
  for await (const event of window.lib.sse("/v1/chat/completions", {})) break; // the caller leaves early
  const left = await Promise.race([gone, new Promise((resolve) => setTimeout(() => resolve(false), 2000))]);
  return { whole, cut, left };
}"""


async def test_sse_reports_a_cut_off_stream_and_cancels_when_left(tab: Tab) -> None:
    result: dict[str, Any] = await (await lib_page(tab)).evaluate(SSE)
    assert result["whole"] == {"got": [1, 2], "error": None}
    assert result["cut"]["got"] == [1]
    assert result["cut"]["error"] == ["ApiError", 0, "The stream ended early: the reply is cut off."]
    assert result["left"] is True  # the connection is closed, not left open
