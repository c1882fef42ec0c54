// Speech to text: an uploaded or recorded clip → /v1/audio/transcriptions → its transcript
// (and the language the model heard, from verbose_json).
import { api, field, formatSeconds, h } from "./lib.js";
import { blobPlayer, errorRegion, modelPicker, panel, running } from "./playground-common.js";
import { recordingSupported, startRecording } from "./playground-recorder.js";

export function transcribePanel(models) {
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
