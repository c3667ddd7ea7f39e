// A WHEP player (draft-ietf-wish-whep): pulls a stream's live video from the service into a
// <video>, and maps each frame it shows back to the stream's pts, so that boxes are drawn on the
// frame they belong to. The service forwards the camera's own H.264 packets; their RTP timestamps
// are the pts at 90 kHz plus an origin that the viewer's resource tells once a frame has gone out.

const GATHER_MS = 2000; // host candidates on this machine take milliseconds; a STUN server longer
const CLOCK_EVERY_MS = 300;
const CLOCK_TRIES = 40;

export class NotOffered extends Error {}

function gathered(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, GATHER_MS); // whatever was gathered by then goes in the offer
    pc.addEventListener("icegatheringstatechange", () => {
      if (pc.iceGatheringState === "complete") {
        clearTimeout(timer);
        resolve();
      }
    });
  });
}

export class WhepPlayer {
  constructor(api, errorText) {
    this.api = api;
    this.errorText = errorText;
    this.pc = null;
    this.location = null;
    this.origin = null; // RTP timestamp of pts 0, once known
  }

  // Whether the service forwards this stream's video, without a failed request in the console:
  // OPTIONS answers 204 and says so in a header.
  async offered(id) {
    const response = await this.api(`/whep/${encodeURIComponent(id)}`, { method: "OPTIONS" });
    const said = response.headers.get("Vidsentry-Live-Video") || "";
    if (said !== "offered") throw new NotOffered(said.replace(/^not offered;\s*/, "") || "not offered");
  }

  async start(id, video, signal) {
    await this.offered(id);
    const pc = (this.pc = new RTCPeerConnection());
    const transceiver = pc.addTransceiver("video", { direction: "recvonly" });
    pc.addEventListener("track", (event) => {
      video.srcObject = event.streams[0] || new MediaStream([event.track]);
    });
    await pc.setLocalDescription(await pc.createOffer());
    await gathered(pc);
    const response = await this.api(`/whep/${encodeURIComponent(id)}`, {
      method: "POST", signal, headers: { "Content-Type": "application/sdp" }, body: pc.localDescription.sdp,
    });
    if (response.status !== 201) throw new Error(await this.errorText(response));
    this.location = response.headers.get("Location");
    await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
    this.receiver = transceiver.receiver;
    this.readClock(signal);
  }

  // The boxes arrive after their frame (detection takes time): hold frames that long before
  // showing them, so each frame's boxes are there when it is shown.
  holdFor(ms) {
    if (this.receiver && "jitterBufferTarget" in this.receiver) {
      this.receiver.jitterBufferTarget = Math.max(0, Math.min(4000, Math.round(ms)));
    }
  }

  async readClock(signal) {
    for (let i = 0; i < CLOCK_TRIES && !signal.aborted && this.location; i += 1) {
      try {
        const response = await this.api(this.location, { signal });
        if (response.ok) {
          const body = await response.json();
          if (Number.isInteger(body.rtp_origin)) {
            this.origin = body.rtp_origin;
            this.clockRate = body.rtp_clock_rate;
            return;
          }
        }
      } catch {
        if (signal.aborted) return;
      }
      await new Promise((resolve) => setTimeout(resolve, CLOCK_EVERY_MS));
    }
  }

  // The pts of a frame shown, from requestVideoFrameCallback's metadata; null before the clock.
  ptsOf(metadata) {
    if (this.origin === null || metadata.rtpTimestamp === undefined) return null;
    const ticks = (metadata.rtpTimestamp - this.origin + 2 ** 32) % 2 ** 32;
    return ticks / this.clockRate;
  }

  stop() {
    if (this.location) {
      this.api(this.location, { method: "DELETE" }).catch(() => {});
    }
    if (this.pc) this.pc.close();
    this.pc = null;
    this.location = null;
    this.origin = null;
  }
}
