// Live microphone into a session: getUserMedia + an AudioWorklet (an inline module loaded from a
// Blob URL, so there is no build step) cut the input into 20 ms frames of mono 16-bit PCM that go,
// as binary WebSocket messages, to the session's audio socket /sessions/{id}/audio (ws.py). The
// presenter speaks while the user is still talking; stopping sends {"type": "speech_end"}.
//
// The socket takes `?sample_rate=&format=s16le` (8-192 kHz; 48 kHz is its default and the WebRTC
// data channel's only rate), so the capture context asks for 48 kHz and tells the server whatever
// rate it really got (the server resamples). A voice gate keeps frames back until the input is
// louder than `gateDb`, then sends a short pre-roll and streams everything until the mic stops:
// merely opening the mic never cuts the presenter off; the first frame the server gets is speech,
// and under the server's rule that first chunk after a pause is what barges in.
"use strict";

const WORKLET_SOURCE = `
class NewsStudioPcmFramer extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.n = options.processorOptions.frameSamples;
    this.buf = new Int16Array(this.n);
    this.fill = 0;
    this.sum = 0;
    this.peak = 0;
    this.done = false;
    this.port.onmessage = (e) => { if (e.data && e.data.type === "flush") this.flush(); };
  }
  emit(last) {
    const pcm = this.fill === this.n ? this.buf : this.buf.slice(0, this.fill);
    const rms = this.fill ? Math.sqrt(this.sum / this.fill) : 0;
    this.port.postMessage({ pcm: pcm.buffer, rms, peak: this.peak, last }, [pcm.buffer]);
    this.buf = new Int16Array(this.n);
    this.fill = 0;
    this.sum = 0;
    this.peak = 0;
  }
  flush() {
    if (this.done) return;
    this.done = true;
    this.emit(true);
  }
  process(inputs) {
    if (this.done) return false;
    const chans = inputs[0];
    if (!chans || !chans.length) return true;
    const nch = chans.length, len = chans[0].length;
    for (let i = 0; i < len; i++) {
      let x = 0;
      for (let c = 0; c < nch; c++) x += chans[c][i];
      x /= nch;
      x = x > 1 ? 1 : x < -1 ? -1 : x;
      this.sum += x * x;
      const a = x < 0 ? -x : x;
      if (a > this.peak) this.peak = a;
      this.buf[this.fill++] = Math.round(x < 0 ? x * 32768 : x * 32767);
      if (this.fill === this.n) this.emit(false);
    }
    return true;
  }
}
registerProcessor("newsstudio-pcm-framer", NewsStudioPcmFramer);
`;

class LiveMic {
  /** Whether this browser can stream the microphone (else: record, then upload). */
  static supported() {
    return !!(window.AudioContext && window.AudioWorkletNode && window.WebSocket && navigator.mediaDevices && navigator.mediaDevices.getUserMedia
      && AudioContext.prototype && "audioWorklet" in AudioContext.prototype);
  }

  /**
   * sessionId: the live session to speak into. Callbacks: onFrame({db, gateOpen}) every 20 ms,
   * onPhase(phase) with "starting" | "listening" (on, waiting for voice) | "streaming" | "off",
   * onError(Error) when the mic or the socket fails (the mic is then off).
   */
  constructor({ sessionId, onFrame = () => {}, onPhase = () => {}, onError = () => {}, gateDb = -45, prerollMs = 300, targetRate = 48000, frameMs = 20 }) {
    this.sessionId = sessionId;
    this.onFrame = onFrame;
    this.onPhase = onPhase;
    this.onError = onError;
    this.gateDb = gateDb;
    this.prerollFrames = Math.max(0, Math.round(prerollMs / frameMs));
    this.targetRate = targetRate;
    this.frameMs = frameMs;
    this.phase = "off";
    this.stats = {
      phase: "off", sampleRate: null, frameSamples: null, framesCaptured: 0, framesSent: 0, bytesSent: 0, levelDb: -120,
      gateOpen: false, startedAt: null, firstVoiceAt: null, stoppedAt: null, speechEndSent: false, socket: "closed",
    };
    this._preroll = [];
    this._pending = [];
    this._cancel = false;
    this._flushed = null;
  }

  _setPhase(p) {
    this.phase = p;
    this.stats.phase = p;
    this.onPhase(p);
  }

  async start() {
    if (this.phase !== "off") return;
    this._setPhase("starting");
    this.stats.startedAt = performance.now();
    try {
      this.stream = await navigator.mediaDevices.getUserMedia({
        audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
      });
      if (this._cancel) throw new DOMException("stopped while starting", "AbortError");
      this.ctx = await this._context();
      const rate = this.ctx.sampleRate;
      const n = Math.round((rate * this.frameMs) / 1000);
      this.stats.sampleRate = rate;
      this.stats.frameSamples = n;
      const url = URL.createObjectURL(new Blob([WORKLET_SOURCE], { type: "text/javascript" }));
      try {
        await this.ctx.audioWorklet.addModule(url);
      } finally {
        URL.revokeObjectURL(url);
      }
      // channelCount 1 (explicit): the graph mixes a stereo capture down to mono before the framer
      this.node = new AudioWorkletNode(this.ctx, "newsstudio-pcm-framer", {
        numberOfInputs: 1, numberOfOutputs: 1, outputChannelCount: [1], channelCountMode: "explicit", channelCount: 1,
        processorOptions: { frameSamples: n },
      });
      this.node.port.onmessage = (e) => this._frame(e.data);
      this._openSocket(rate);
      this.source.connect(this.node);
      this.node.connect(this.ctx.destination); // pulls the graph; the framer writes silence
      await this.ctx.resume();
      if (this._cancel) throw new DOMException("stopped while starting", "AbortError");
      this._setPhase("listening");
    } catch (e) {
      const cancelled = this._cancel;
      this._release();
      this._closeSocket();
      this._setPhase("off");
      if (!cancelled) throw e;
    }
  }

  async _context() {
    // 48 kHz is the socket's default rate and the data channel's only one; take what we get
    let ctx = null;
    try {
      ctx = new AudioContext({ sampleRate: this.targetRate, latencyHint: "interactive" });
      this.source = ctx.createMediaStreamSource(this.stream);
      return ctx;
    } catch (_) {
      // some browsers cannot connect a capture at another rate: use the device's rate
      if (ctx) ctx.close().catch(() => {});
    }
    ctx = new AudioContext({ latencyHint: "interactive" });
    this.source = ctx.createMediaStreamSource(this.stream);
    return ctx;
  }

  _openSocket(rate) {
    const proto = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${proto}://${location.host}/sessions/${encodeURIComponent(this.sessionId)}/audio?sample_rate=${rate}&format=s16le`);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    this.stats.socket = "connecting";
    ws.onopen = () => {
      this.stats.socket = "open";
      for (const m of this._pending.splice(0)) this._put(ws, m);
    };
    ws.onclose = (e) => {
      this.stats.socket = "closed";
      if (this.ws !== ws) return;
      this.ws = null;
      if (this.phase !== "off" && this.phase !== "stopping") {
        this.onError(new Error(`Live mic: the server closed the audio socket (${e.code}${e.reason ? ": " + e.reason : ""})`));
        this.stop({ endUtterance: false });
      }
    };
  }

  _send(m) {
    const ws = this.ws;
    if (!ws) return;
    if (ws.readyState === WebSocket.CONNECTING) this._pending.push(m);
    else if (ws.readyState === WebSocket.OPEN) this._put(ws, m);
  }

  _put(ws, m) {
    ws.send(m);
    if (typeof m !== "string") {
      this.stats.framesSent += 1;
      this.stats.bytesSent += m.byteLength;
    }
  }

  _frame(d) {
    const st = this.stats;
    const db = 20 * Math.log10(Math.max(d.rms, 1e-6));
    if (d.pcm.byteLength) {
      st.framesCaptured += 1;
      st.levelDb = db;
      if (st.gateOpen) {
        this._send(d.pcm);
      } else if (db >= this.gateDb && (this.phase === "listening" || this.phase === "streaming")) {
        // voice: the pre-roll goes first, so the onset is not clipped
        st.gateOpen = true;
        st.firstVoiceAt = performance.now();
        for (const p of this._preroll.splice(0)) this._send(p);
        this._send(d.pcm);
        this._setPhase("streaming");
      } else {
        this._preroll.push(d.pcm);
        if (this._preroll.length > this.prerollFrames) this._preroll.shift();
      }
      this.onFrame({ db, gateOpen: st.gateOpen });
    }
    if (d.last && this._flushed) this._flushed();
  }

  /** Mic off. endUtterance: tell the server the utterance is complete (it plays out, then idles). */
  async stop({ endUtterance = true } = {}) {
    if (this.phase === "off" || this.phase === "stopping") return;
    if (this.phase === "starting") {
      this._cancel = true; // start() unwinds itself
      return;
    }
    this._setPhase("stopping");
    if (this.node) {
      // the partial frame still in the worklet is part of what was said
      await new Promise((resolve) => {
        this._flushed = resolve;
        setTimeout(resolve, 250);
        try { this.node.port.postMessage({ type: "flush" }); } catch (_) { resolve(); }
      });
    }
    this._release();
    if (this.stats.gateOpen && endUtterance) {
      this._send(JSON.stringify({ type: "speech_end" }));
      this.stats.speechEndSent = true;
    }
    this._closeSocket();
    this.stats.stoppedAt = performance.now();
    this._setPhase("off");
  }

  _release() {
    if (this.node) { try { this.node.port.onmessage = null; this.node.disconnect(); } catch (_) {} }
    if (this.source) { try { this.source.disconnect(); } catch (_) {} }
    if (this.stream) for (const t of this.stream.getTracks()) t.stop();
    if (this.ctx) this.ctx.close().catch(() => {});
    this.node = this.source = this.stream = this.ctx = null;
    this._preroll = [];
  }

  _closeSocket() {
    const ws = this.ws;
    this.ws = null;
    if (!ws) return;
    // what is queued (frames, speech_end) goes out before the close frame
    const pending = this._pending.splice(0);
    if (ws.readyState === WebSocket.CONNECTING) {
      ws.onopen = () => {
        this.stats.socket = "open";
        for (const m of pending) this._put(ws, m);
        ws.close(1000, "mic off");
      };
    } else if (ws.readyState === WebSocket.OPEN) {
      ws.close(1000, "mic off");
    }
  }
}

window.LiveMic = LiveMic;
