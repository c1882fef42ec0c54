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
  const release = () => stream.getTracks().forEach((track) => track.stop());
  const chunks = [];
  let recorder;
  let finished;
  try {
    recorder = new MediaRecorder(stream);
    recorder.addEventListener("dataavailable", (event) => {
      if (event.data.size) chunks.push(event.data);
    });
    finished = new Promise((resolve) => {
      recorder.addEventListener("stop", () => {
        release();
        resolve(new Blob(chunks, { type: recorder.mimeType || "audio/webm" }));
      });
    });
    recorder.start();
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
