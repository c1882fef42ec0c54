// The speech tab: text → /v1/audio/speech → an <audio> player, beside speech to text
// (playground-transcribe.js).
import { api, errorRegion, field, h } from "./lib.js";
import { blobPlayer, modelPicker, numberField, panel, running } from "./playground-common.js";
import { transcribePanel } from "./playground-transcribe.js";

export function speechSection(models) {
  const speak = speakPanel(models);
  const listen = transcribePanel(models);
  const element = h("div", { class: "pg-speech" }, speak.element, listen.element);
  return { element, stop: () => { speak.stop(); listen.stop(); } };
}

function speakPanel(models) {
  const voices = h("select", {});
  const picker = modelPicker("Model", models, "speech", () => fillVoices());
  const text = h("textarea", { class: "pg-prose", rows: 3 });
  text.value = "The meeting starts at noon. Please bring the quarterly report.";
  const speed = numberField("Speed", { min: 0.25, max: 4, step: 0.05, value: "1" });
  const button = h("button", { type: "submit", text: "Speak", disabled: !picker.current() });
  const player = blobPlayer("Synthesised speech");
  const download = h("a", { class: "pg-download", download: "speech.wav", hidden: true, text: "Download WAV" });
  const output = h("div", { class: "pg-player" }, player.audio, download);
  const errors = errorRegion();
  const calls = new AbortController(); // leaving the page cancels a call in progress
  let listed = [];

  function fillVoices() {
    const model = picker.current();
    const mine = listed.filter((voice) => voice.model === model?.id);
    voices.replaceChildren(...mine.map((voice) =>
      h("option", { value: voice.voice, text: voice.language ? `${voice.voice} (${voice.language})` : voice.voice })));
    if (!mine.length) voices.append(h("option", { value: "", text: "the model's default" }));
  }
  fillVoices();
  // Listing voices reads the models' files and loads nothing, so it is cheap to ask.
  api("/v1/audio/voices", { signal: calls.signal }).then((answer) => {
    listed = answer.data;
    fillVoices();
  }).catch((error) => {
    if (error.name !== "AbortError") errors.show(`Could not list the voices: ${error.message}`);
  });

  const form = h("form", { class: "pg-form" },
    picker.element,
    h("div", { class: "pg-fields pg-voice-row" }, field("Voice", voices), speed.element),
    field("Text", text),
    h("div", { class: "row" }, button),
    errors.node,
    output);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    running(button, output, errors, async () => {
      if (!text.value.trim()) throw new Error("Type something to say.");
      const body = { model: picker.current().id, input: text.value, response_format: "wav" };
      if (voices.value) body.voice = voices.value;
      const chosen = speed.value();
      if (chosen !== undefined) body.speed = chosen;
      const response = await api("/v1/audio/speech", { json: body, raw: true, signal: calls.signal });
      download.href = player.show(await response.blob());
      download.hidden = false;
      // Clicking Speak is the user's gesture, so the browser lets it play at once.
      player.audio.play().catch(() => {});
    });
  });
  const stop = () => {
    calls.abort();
    player.stop();
  };
  return { element: panel("Text to speech", "pg-speak-title", form), stop };
}
