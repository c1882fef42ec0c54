// Microphone recording with MediaRecorder. Browsers give the microphone to secure pages
// only (https, or http on localhost): elsewhere navigator.mediaDevices is missing.

export function recordingSupported() {
  return Boolean(navigator.mediaDevices?.getUserMedia) && typeof MediaRecorder !== "undefined";
}

/**
 * Ask for the microphone and start recording. Returns {stop, cancel}: stop() resolves to
 * the recording as a Blob (webm/ogg, which the server decodes like any upload); both
 * release the microphone.
 */
export async function startRecording() {
  const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  const recorder = new MediaRecorder(stream);
  const chunks = [];
  recorder.addEventListener("dataavailable", (event) => {
    if (event.data.size) chunks.push(event.data);
  });
  const release = () => stream.getTracks().forEach((track) => track.stop());
  const finished = new Promise((resolve) => {
    recorder.addEventListener("stop", () => {
      release();
      resolve(new Blob(chunks, { type: recorder.mimeType || "audio/webm" }));
    });
  });
  recorder.start();
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
