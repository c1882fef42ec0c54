// The speech tab: text → /v1/audio/speech → an <audio> player; an uploaded or recorded
// clip → /v1/audio/transcriptions → its transcript (and the language Whisper heard).
import { api, field, formatSeconds, h } from "./lib.js";
import { errorRegion, modelPicker, numberField, panel, running } from "./playground-common.js";
import { recordingSupported, startRecording } from "./playground-recorder.js";

export function speechSection(models) {
  const speak = speakPanel(models);
  const listen = transcribePanel(models);
  const element = h("div", { class: "pg-speech" }, speak.element, listen.element);
  return { element, stop: () => { speak.stop(); listen.stop(); } };
}

/** Object URLs of one player, revoked when replaced or when the page goes away. */
function blobPlayer(label) {
  let url = null;
  const audio = h("audio", { controls: true, "aria-label": label, hidden: true });
  return {
    audio,
    show(blob) {
      if (url) URL.revokeObjectURL(url);
      url = URL.createObjectURL(blob);
      audio.src = url;
      audio.hidden = false;
      return url;
    },
    stop() {
      audio.pause();
      if (url) URL.revokeObjectURL(url);
    },
  };
}

function speakPanel(models) {
  const voices = h("select", {});
  const picker = modelPicker("Model", models, "speech", () => fillVoices());
  const text = h("textarea", { rows: 4 });
  text.value = "The meeting starts at noon. Please bring the quarterly report.";
  const speed = numberField("Speed", { min: 0.25, max: 4, step: 0.05, value: "1" });
  const button = h("button", { type: "submit", text: "Speak", disabled: !picker.current() });
  const player = blobPlayer("Synthesised speech");
  const download = h("a", { class: "pg-download", download: "speech.wav", hidden: true, text: "Download WAV" });
  const output = h("div", { class: "pg-player" }, player.audio, download);
  const errors = errorRegion();
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
  api("/v1/audio/voices").then((answer) => {
    listed = answer.data;
    fillVoices();
  }).catch((error) => errors.show(`Could not list the voices: ${error.message}`));

  const form = h("form", { class: "pg-form" },
    picker.element,
    h("div", { class: "pg-fields" }, field("Voice", voices), speed.element),
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
      const response = await api("/v1/audio/speech", { json: body, raw: true });
      download.href = player.show(await response.blob());
      download.hidden = false;
      // Clicking Speak is the user's gesture, so the browser lets it play at once.
      player.audio.play().catch(() => {});
    });
  });
  return { element: panel("Text to speech", "pg-speak-title", form), stop: player.stop };
}

function transcribePanel(models) {
  const picker = modelPicker("Model", models, "transcription");
  const file = h("input", { type: "file", accept: "audio/*,video/webm" });
  const button = h("button", { type: "submit", text: "Transcribe file", disabled: !picker.current() });
  const record = h("button", { type: "button", class: "secondary", text: "Record" });
  const recordState = h("span", { class: "hint", "aria-live": "polite" });
  const player = blobPlayer("Recording");
  const transcript = h("div", { class: "pg-transcript" },
    h("p", { class: "muted", text: "The transcript appears here." }));
  const errors = errorRegion();
  let recording = null;
  let timer = null;

  async function transcribe(blob, name) {
    const form = new FormData();
    form.append("file", blob, name);
    form.append("model", picker.current().id);
    form.append("response_format", "verbose_json");
    const answer = await api("/v1/audio/transcriptions", { form });
    const details = [answer.language && `language: ${answer.language}`,
      answer.duration !== undefined && `${formatSeconds(answer.duration)} of audio`].filter(Boolean);
    transcript.replaceChildren(h("p", { class: "pg-transcript-text", text: answer.text.trim() }),
      h("p", { class: "hint pg-transcript-meta", text: details.join(" · ") }));
  }

  function stopTimer() {
    clearInterval(timer);
    timer = null;
  }

  async function toggleRecording() {
    errors.clear();
    if (recording) {
      const taken = recording;
      recording = null;
      stopTimer();
      record.textContent = "Record";
      recordState.textContent = "";
      const blob = await taken.stop();
      player.show(blob);
      await running(button, transcript, errors, () => transcribe(blob, "recording.webm"));
      return;
    }
    try {
      recording = await startRecording();
    } catch (error) {
      errors.show(`The microphone is not available: ${error.message}`);
      return;
    }
    record.textContent = "Stop recording";
    const started = Date.now();
    const tick = () => { recordState.textContent = `Recording… ${Math.floor((Date.now() - started) / 1000)} s`; };
    tick();
    timer = setInterval(tick, 500);
  }

  const supported = recordingSupported();
  record.disabled = !supported || !picker.current();
  record.addEventListener("click", toggleRecording);
  const recordHint = h("small", { id: "pg-record-hint", class: "hint", text: supported
    ? "Records from the microphone until you stop, then transcribes."
    : "Recording needs the microphone, which browsers allow only on https or localhost pages. Upload a file instead." });
  record.setAttribute("aria-describedby", recordHint.id);

  const form = h("form", { class: "pg-form" },
    picker.element,
    field("Audio file", file, "WAV, MP3, FLAC, OGG, WebM…"),
    h("div", { class: "row" }, button, record, recordState),
    recordHint,
    player.audio,
    errors.node);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    running(button, transcript, errors, async () => {
      const chosen = file.files[0];
      if (!chosen) throw new Error("Choose an audio file first.");
      await transcribe(chosen, chosen.name);
    });
  });
  const stop = () => {
    stopTimer();
    recording?.cancel();
    player.stop();
  };
  return { element: panel("Speech to text", "pg-listen-title", form, h("h3", { text: "Transcript" }), transcript), stop };
}
