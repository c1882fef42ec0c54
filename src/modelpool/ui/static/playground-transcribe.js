// Speech to text: an uploaded or recorded clip → /v1/audio/transcriptions → its transcript
// (and the language the model heard, from verbose_json).
import { api, errorRegion, field, formatDuration, h, isBusy, setBusy } from "./lib.js";
import { blobPlayer, modelPicker, panel, running } from "./playground-common.js";
import { recordingSupported, startRecording } from "./playground-recorder.js";

export function transcribePanel(models) {
  const picker = modelPicker("Model", models, "transcription");
  const file = h("input", { type: "file", accept: "audio/*,video/webm" });
  const button = h("button", { type: "submit", text: "Transcribe file", disabled: !picker.current() });
  const record = h("button", { type: "button", class: "secondary", text: "Record" });
  // The seconds counter is for the eyes; a screen reader hears only "started" and "stopped"
  // (a live region rewritten every second would talk over everything else).
  const recordState = h("span", { class: "hint" });
  const announce = h("span", { class: "visually-hidden", role: "status" });
  const player = blobPlayer("Recording");
  const transcript = h("div", { class: "pg-transcript" },
    h("p", { class: "muted", text: "The transcript appears here." }));
  const errors = errorRegion();
  const calls = new AbortController(); // leaving the page cancels a transcription in progress
  let recording = null; // the recorder while the microphone is on
  let timer = null;
  let closed = false; // the page was left: nothing may start any more

  async function transcribe(blob, name) {
    const form = new FormData();
    form.append("file", blob, name);
    form.append("model", picker.current().id);
    form.append("response_format", "verbose_json");
    const answer = await api("/v1/audio/transcriptions", { form, signal: calls.signal });
    const details = [answer.language && `language: ${answer.language}`,
      answer.duration !== undefined && `${formatDuration(answer.duration, { precise: true })} of audio`].filter(Boolean);
    transcript.replaceChildren(h("p", { class: "pg-transcript-text", text: answer.text.trim() }),
      h("p", { class: "hint pg-transcript-meta", text: details.join(" · ") }));
  }

  function startTimer() {
    clearInterval(timer); // one counter, whatever came before
    const started = Date.now();
    const tick = () => { recordState.textContent = `Recording… ${Math.floor((Date.now() - started) / 1000)} s`; };
    tick();
    timer = setInterval(tick, 500);
  }

  function stopTimer() {
    clearInterval(timer);
    timer = null;
    recordState.textContent = "";
  }

  async function finishRecording() {
    const taken = recording;
    recording = null;
    stopTimer();
    record.textContent = "Record";
    announce.textContent = "Recording stopped.";
    const blob = await taken.stop();
    if (!blob.size) {
      errors.show("The microphone sent no sound before the recording stopped: nothing to transcribe. Record again.");
      return;
    }
    player.show(blob);
    await running(button, transcript, errors, () => transcribe(blob, "recording.webm"));
  }

  /**
   * Record, or stop and transcribe. While the microphone is being asked for, the button is
   * busy (a second press starts nothing), and a double-click's second click is no press at
   * all; a page left meanwhile gets its microphone released as soon as it is granted.
   */
  async function toggleRecording() {
    if (isBusy(record) || closed) return;
    errors.clear();
    if (recording) return finishRecording();
    setBusy(record, true);
    recordState.textContent = "Asking for the microphone…";
    let taken;
    try {
      taken = await startRecording(() => {
        if (recording === taken) startTimer(); // the counter counts seconds of sound
      });
    } catch (error) {
      if (!closed) errors.show(`The microphone is not available: ${error.message}`);
      return;
    } finally {
      setBusy(record, false);
      recordState.textContent = "";
    }
    if (closed) {
      taken.cancel();
      return;
    }
    recording = taken;
    record.textContent = "Stop recording";
    announce.textContent = "Recording started.";
    recordState.textContent = "Waiting for sound from the microphone…";
  }

  const supported = recordingSupported();
  record.disabled = !supported || !picker.current();
  // A double-click is one press: its second click (detail 2) would otherwise stop a recording
  // the first one started as soon as the microphone came fast (seen under load in the tests).
  record.addEventListener("click", (event) => {
    if (event.detail < 2) toggleRecording();
  });
  const recordHint = h("small", { id: "pg-record-hint", class: "hint", text: supported
    ? "Records from the microphone until you stop, then transcribes."
    : "Recording needs the microphone, which browsers allow only on https or localhost pages. Upload a file instead." });
  record.setAttribute("aria-describedby", recordHint.id);

  const form = h("form", { class: "pg-form" },
    picker.element,
    field("Audio file", file, "WAV, MP3, FLAC, OGG, WebM…"),
    h("div", { class: "row" }, button, record, recordState, announce),
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
    closed = true;
    stopTimer();
    recording?.cancel();
    recording = null;
    calls.abort();
    player.stop();
  };
  return { element: panel("Speech to text", "pg-listen-title", form, h("h3", { text: "Transcript" }), transcript), stop };
}
