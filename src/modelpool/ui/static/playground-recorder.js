// Microphone recording with MediaRecorder. Browsers give the microphone to secure pages
// only (https, or http on localhost): elsewhere navigator.mediaDevices is missing.

export function recordingSupported() {
  return Boolean(navigator.mediaDevices?.getUserMedia) && typeof MediaRecorder !== "undefined";
}

// How often the recorder hands over what it has: the first non-empty piece is the sign that
// the microphone really sends sound (a busy machine can take seconds to start it, and a
// recording stopped before then holds no audio at all).
const SLICE_MS = 250;

/**
 * Ask for the microphone and start recording; `onSound` is called once, when the first
 * audio arrives. Returns {stop, cancel}: stop() resolves to the recording as a Blob
 * (webm/ogg, which the server decodes like any upload; empty when no sound ever came);
 * both release the microphone.
 */
export async function startRecording(onSound = () => {}) {
  const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  const release = () => stream.getTracks().forEach((track) => track.stop());
  const chunks = [];
  let recorder;
  let finished;
  try {
    recorder = new MediaRecorder(stream);
    recorder.addEventListener("dataavailable", (event) => {
      if (!event.data.size) return;
      if (!chunks.length) onSound();
      chunks.push(event.data);
    });
    finished = new Promise((resolve) => {
      recorder.addEventListener("stop", () => {
        release();
        resolve(new Blob(chunks, { type: recorder.mimeType || "audio/webm" })); // pieces of one file
      });
    });
    recorder.start(SLICE_MS);
  } catch (error) {
    release(); // no recording came of it: the microphone must not stay on
    throw error;
  }
  return {
    stop() {
      if (recorder.state !== "inactive") recorder.stop();
      return finished;
    },
    cancel() {
      if (recorder.state !== "inactive") recorder.stop();
      release();
    },
  };
}
