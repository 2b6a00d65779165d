// NewsStudio live page: pick a presenter, connect over WebRTC, make it speak, interrupt it.
// Plain JS, no build step. Everything the page measures is also exposed on window.newsstudio
// (state, stats, a history of mouth-motion / audio-level samples) for automated checks.
"use strict";

const $ = (id) => document.getElementById(id);
const ns = (window.newsstudio = {
  state: "disconnected",
  sessionId: null,
  avatar: null,
  engine: null,
  stats: {},
  server: null,
  history: [], // {t, mouth, rms, level, state}
  events: [],
  baseline: null,
  tts: false,
  mic: { phase: "off" }, // the live microphone's counters (LiveMic.stats) while one exists
});

let pc = null;
let dc = null;
let remote = null;
let audioCtx = null;
let analyser = null;
let avatars = [];
let statsTimer = null;
let pingTimer = null;
let probeTimer = null;
let recorder = null;
let recChunks = [];
let liveMic = null;
const MIC_SUPPORTED = typeof LiveMic !== "undefined" && LiveMic.supported();
let lastFrames = null;

// ------------------------------------------------------------------ ui helpers
function log(text, kind = "") {
  const li = document.createElement("li");
  li.className = kind;
  const t = document.createElement("time");
  t.textContent = new Date().toLocaleTimeString([], { hour12: false });
  const s = document.createElement("span");
  s.textContent = text;
  li.append(t, s);
  $("log").prepend(li);
  while ($("log").children.length > 80) $("log").lastChild.remove();
  ns.events.push({ t: performance.now(), text, kind });
}

let toastTimer = null;
function toast(text) {
  const el = $("toast");
  el.textContent = text;
  el.classList.add("show");
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => el.classList.remove("show"), 5000);
}

function fail(err) {
  const msg = err && err.message ? err.message : String(err);
  log(msg, "err");
  toast(msg);
}

const STATE_TEXT = { disconnected: "Offline", connecting: "Connecting", idle: "Idle", speaking: "Speaking", buffering: "Buffering", error: "Error" };
function setState(state) {
  ns.state = state;
  $("stage").dataset.state = state;
  $("state-text").textContent = STATE_TEXT[state] || state;
  const live = ["idle", "speaking", "buffering"].includes(state);
  $("interrupt").disabled = !live;
  $("speak-file").disabled = !live || !$("file").files.length;
  const micOn = liveMic !== null;
  $("record").disabled = !live || micOn;
  $("live-mic").disabled = !MIC_SUPPORTED || (!live && !micOn) || (recorder !== null && recorder.state === "recording");
  $("say").disabled = !live || !ns.tts;
  const btn = $("connect");
  btn.disabled = state === "connecting";
  btn.textContent = live ? "Disconnect" : state === "connecting" ? "Connecting…" : "Connect";
  btn.classList.toggle("primary", !live);
  btn.classList.toggle("connected", live);
}

async function api(path, opts = {}) {
  const r = await fetch(path, opts);
  let body = null;
  try { body = await r.json(); } catch (_) { /* not JSON */ }
  if (!r.ok) {
    const detail = body && body.detail ? (typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail)) : r.statusText;
    throw new Error(detail);
  }
  return body;
}

// ------------------------------------------------------------------ server, avatars, engines
async function loadServer() {
  const el = $("server-status");
  try {
    const r = await fetch("/health");  // 503 with the same body when a shared GPU batch has stalled
    const h = await r.json();
    if (!r.ok && h.status !== "stalled") throw new Error(r.statusText);
    const stalled = h.status === "stalled";
    el.className = stalled ? "server bad" : "server ok";
    el.querySelector(".label").textContent = stalled
      ? `${h.device.toUpperCase()} stalled (${h.stalled_batchers.join(", ")}): restart the server`
      : `${h.device.toUpperCase()} · ${h.active_sessions}/${h.max_sessions} sessions`;
    ns.tts = h.tts.available;
    $("tts-status").textContent = h.tts.available ? `Voice: ${h.tts.engine}` : "Text to speech unavailable on this server";
    const sel = $("engine");
    const keep = sel.value;
    sel.innerHTML = "";
    for (const e of h.engines) {
      const o = document.createElement("option");
      o.value = e.name;
      o.textContent = e.name + (e.default ? " (default)" : "") + (e.available === false ? " — unavailable" : "");
      o.disabled = e.available === false;
      sel.append(o);
    }
    sel.value = keep || h.default_engine;
    setState(ns.state);
  } catch (e) {
    el.className = "server bad";
    el.querySelector(".label").textContent = "Server unreachable";
  }
}

async function loadAvatars() {
  const box = $("avatars");
  try {
    avatars = (await api("/avatars")).avatars;
  } catch (e) {
    fail(e);
    avatars = [];
  }
  box.innerHTML = "";
  $("avatar-count").textContent = avatars.length ? `${avatars.length} available` : "";
  if (!avatars.length) {
    const d = document.createElement("div");
    d.className = "empty";
    d.textContent = "No avatars yet — upload one with POST /avatars";
    box.append(d);
    return;
  }
  for (const a of avatars) {
    const b = document.createElement("button");
    b.className = "avatar";
    b.setAttribute("role", "option");
    b.dataset.id = a.id;
    b.title = `${a.id} · ${a.width}×${a.height} · ${a.kind}`;
    const img = document.createElement("img");
    img.src = a.preview_url;
    img.alt = a.id;
    const tag = document.createElement("span");
    tag.className = "tag";
    tag.textContent = a.id;
    b.append(img, tag);
    b.onclick = () => selectAvatar(a.id);
    box.append(b);
  }
  selectAvatar(ns.avatar && avatars.some((a) => a.id === ns.avatar) ? ns.avatar : avatars[0].id);
}

function selectAvatar(id) {
  ns.avatar = id;
  for (const el of $("avatars").children) el.setAttribute("aria-selected", String(el.dataset.id === id));
  const a = avatars.find((x) => x.id === id);
  if (a) {
    $("placeholder-img").src = a.preview_url;
    $("backdrop").style.backgroundImage = `url("${a.preview_url}")`;
  }
}

// ------------------------------------------------------------------ WebRTC
function waitIceGathering(peer, timeoutMs = 3000) {
  if (peer.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const t = setTimeout(resolve, timeoutMs);
    peer.addEventListener("icegatheringstatechange", () => {
      if (peer.iceGatheringState === "complete") { clearTimeout(t); resolve(); }
    });
  });
}

async function connect() {
  if (!ns.avatar) return toast("Choose a presenter first");
  setState("connecting");
  ns.engine = $("engine").value;
  try {
    pc = new RTCPeerConnection();
    pc.addTransceiver("video", { direction: "recvonly" });
    pc.addTransceiver("audio", { direction: "recvonly" });
    dc = pc.createDataChannel("control");
    dc.onmessage = onControl;
    dc.onopen = () => { pingTimer = setInterval(() => dc.readyState === "open" && dc.send(JSON.stringify({ type: "ping", t: performance.now() })), 2000); };
    remote = new MediaStream();
    pc.ontrack = (e) => {
      remote.addTrack(e.track);
      const v = $("video");
      v.srcObject = remote;
      v.muted = false;
      v.play().catch(() => {});
      if (e.track.kind === "audio") setupAudio();
    };
    pc.onconnectionstatechange = () => {
      if (pc && ["failed", "closed"].includes(pc.connectionState)) {
        fail(new Error(`connection ${pc.connectionState}`));
        disconnect(false);
      }
    };
    await pc.setLocalDescription(await pc.createOffer());
    await waitIceGathering(pc);
    const ans = await api("/webrtc/offer", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ sdp: pc.localDescription.sdp, type: "offer", avatar: ns.avatar, engine: ns.engine }),
    });
    ns.sessionId = ans.session_id;
    ns.size = [ans.width, ans.height];
    await pc.setRemoteDescription({ type: ans.type, sdp: ans.sdp });
    log(`Connected to ${ns.avatar} (${ns.engine}, ${ans.width}×${ans.height} @ ${ans.fps} fps)`, "ok");
    loadServer();
    ns.baseline = null;
    setState("idle");
    statsTimer = setInterval(pollStats, 500);
    probeTimer = setInterval(probeAudio, 25);
    $("video").requestVideoFrameCallback(onVideoFrame);
  } catch (e) {
    fail(e);
    disconnect(false);
  }
}

function disconnect(say = true) {
  if (liveMic) liveMic.stop({ endUtterance: false });
  clearInterval(statsTimer);
  clearInterval(pingTimer);
  clearInterval(probeTimer);
  if (dc) try { dc.close(); } catch (_) {}
  if (pc) try { pc.close(); } catch (_) {}
  if (ns.sessionId) fetch(`/sessions/${ns.sessionId}`, { method: "DELETE" }).catch(() => {});
  pc = dc = null;
  prevLuma = null;
  ns.sessionId = null;
  $("video").srcObject = null;
  if (say) log("Disconnected");
  setState("disconnected");
  loadServer();
}

function onControl(ev) {
  let m;
  try { m = JSON.parse(ev.data); } catch (_) { return; }
  if (m.type === "state") {
    ns.server = m;
    if (["idle", "speaking", "buffering"].includes(m.state) && m.state !== ns.state) setState(m.state);
  } else if (m.type === "pong") {
    ns.stats.appRttMs = performance.now() - m.t;
  } else if (m.type === "interrupted") {
    if (m.interrupted) log(`Interrupted: cut within ${m.cut_latency_ms.toFixed(0)} ms of media time, ${m.dropped_frames} queued frames dropped`, "ok");
  } else if (m.type === "error") {
    fail(new Error(m.message));
  }
}

function setupAudio() {
  try {
    audioCtx = audioCtx || new AudioContext();
    const src = audioCtx.createMediaStreamSource(remote);
    analyser = audioCtx.createAnalyser();
    analyser.fftSize = 1024;
    src.connect(analyser);
    audioCtx.resume().catch(() => {});
  } catch (e) {
    analyser = null;
  }
}

// Mouth region of every decoded frame (canvas): `mouth` = difference from the idle baseline,
// `motion` = difference from the previous frame. Audio level sampled every 25 ms.
let prevLuma = null;
function onVideoFrame() {
  const v = $("video");
  if (!pc) return;
  v.requestVideoFrameCallback(onVideoFrame);
  const a = avatars.find((x) => x.id === ns.avatar);
  if (!v.videoWidth || !a || !a.mouth_box) return;
  const c = $("probe");
  if (c.width !== v.videoWidth) { c.width = v.videoWidth; c.height = v.videoHeight; }
  const ctx = c.getContext("2d", { willReadFrequently: true });
  ctx.drawImage(v, 0, 0);
  const sx = v.videoWidth / a.width, sy = v.videoHeight / a.height;
  const [x0, y0, x1, y1] = a.mouth_box;
  const px = Math.max(0, Math.floor((x0 - 3) * sx)), py = Math.max(0, Math.floor((y0 - 3) * sy));
  const pw = Math.max(1, Math.ceil((x1 - x0 + 6) * sx)), ph = Math.max(1, Math.ceil((y1 - y0 + 6) * sy));
  const d = ctx.getImageData(px, py, pw, ph).data;
  const luma = new Float32Array(pw * ph);
  for (let i = 0; i < luma.length; i++) luma[i] = 0.2126 * d[4 * i] + 0.7152 * d[4 * i + 1] + 0.0722 * d[4 * i + 2];
  const diff = (ref) => {
    if (!ref || ref.length !== luma.length) return null;
    let s = 0;
    for (let i = 0; i < luma.length; i++) s += Math.abs(luma[i] - ref[i]);
    return s / luma.length;
  };
  if (!ns.baseline && ns.state === "idle" && (ns.stats.framesDecoded || 0) > 100) ns.baseline = luma; // once the encoder has ramped up (~4 s)
  const entry = { t: performance.now(), mouth: diff(ns.baseline), motion: diff(prevLuma), rms: null, state: ns.state };
  prevLuma = luma;
  push(entry);
}

function push(entry) {
  ns.history.push(entry);
  if (ns.history.length > 6000) ns.history.splice(0, 2000);
}

function probeAudio() {
  if (!analyser) return;
  const buf = new Float32Array(analyser.fftSize);
  analyser.getFloatTimeDomainData(buf);
  let s = 0;
  for (const x of buf) s += x * x;
  const rms = Math.sqrt(s / buf.length);
  $("st-meter").style.width = `${Math.min(100, rms * 400)}%`;
  push({ t: performance.now(), mouth: null, motion: null, rms, state: ns.state });
}

async function pollStats() {
  if (!pc) return;
  const report = await pc.getStats();
  const st = ns.stats;
  let codecs = {};
  report.forEach((r) => { if (r.type === "codec") codecs[r.id] = r.mimeType; });
  report.forEach((r) => {
    if (r.type === "inbound-rtp" && r.kind === "video") {
      const now = performance.now();
      if (lastFrames) st.fps = ((r.framesDecoded - lastFrames.n) * 1000) / (now - lastFrames.t);
      lastFrames = { n: r.framesDecoded, t: now };
      st.framesDecoded = r.framesDecoded;
      st.framesDropped = r.framesDropped || 0;
      st.width = r.frameWidth;
      st.height = r.frameHeight;
      st.codec = (codecs[r.codecId] || "").replace("video/", "");
      st.jitterMs = r.jitterBufferEmittedCount ? (1000 * r.jitterBufferDelay) / r.jitterBufferEmittedCount : null;
    } else if (r.type === "inbound-rtp" && r.kind === "audio") {
      st.audioLevel = r.audioLevel ?? null;
      st.audioEnergy = r.totalAudioEnergy ?? null;
      st.audioSamples = r.totalSamplesReceived ?? null;
    } else if (r.type === "candidate-pair" && r.state === "succeeded" && r.nominated) {
      st.rttMs = r.currentRoundTripTime != null ? r.currentRoundTripTime * 1000 : st.rttMs;
    }
  });
  const rtt = st.rttMs ?? st.appRttMs;
  st.latencyMs = rtt != null && st.jitterMs != null ? rtt / 2 + st.jitterMs + 1000 / 25 : null;
  $("st-fps").textContent = st.fps != null ? `${st.fps.toFixed(1)} fps` : "–";
  $("st-latency").textContent = st.latencyMs != null ? `≈ ${st.latencyMs.toFixed(0)} ms` : "–";
  $("st-rtt").textContent = rtt != null ? `${rtt.toFixed(1)} ms` : "–";
  $("st-res").textContent = st.width ? `${st.width}×${st.height}` : "–";
  $("st-codec").textContent = st.codec || "–";
}

// ------------------------------------------------------------------ speech
async function speakBlob(blob, name) {
  if (!ns.sessionId) return;
  const fd = new FormData();
  fd.append("audio", blob, name);
  try {
    const r = await api(`/sessions/${ns.sessionId}/speak`, { method: "POST", body: fd });
    log(`Speaking ${name} (${r.duration_s.toFixed(1)} s, starts in ${r.cut_latency_ms.toFixed(0)} ms)`, "ok");
  } catch (e) {
    fail(e);
  }
}

async function interrupt() {
  if (!ns.sessionId) return;
  ns.interruptedAt = performance.now();
  if (dc && dc.readyState === "open") {
    dc.send(JSON.stringify({ type: "interrupt" }));
    return;
  }
  try {
    const r = await api(`/sessions/${ns.sessionId}/interrupt`, { method: "POST" });
    if (r.interrupted) log(`Interrupted: cut within ${r.cut_latency_ms.toFixed(0)} ms of media time`, "ok");
  } catch (e) {
    fail(e);
  }
}

async function say() {
  const text = $("line").value.trim();
  if (!text || !ns.sessionId) return;
  try {
    const r = await api(`/sessions/${ns.sessionId}/say`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ text }) });
    log(`Saying “${text.length > 40 ? text.slice(0, 40) + "…" : text}” (${r.duration_s.toFixed(1)} s)`, "ok");
  } catch (e) {
    fail(e);
  }
}

// Record, then upload (MediaRecorder): the fallback where AudioWorklet is missing.
async function toggleRecord() {
  const btn = $("record");
  if (recorder && recorder.state === "recording") {
    recorder.stop();
    return;
  }
  try {
    const stream = await navigator.mediaDevices.getUserMedia({ audio: { echoCancellation: true, noiseSuppression: true } });
    const type = ["audio/webm;codecs=opus", "audio/ogg;codecs=opus", "audio/webm"].find((t) => MediaRecorder.isTypeSupported(t)) || "";
    recorder = new MediaRecorder(stream, type ? { mimeType: type } : {});
    recChunks = [];
    recorder.ondataavailable = (e) => e.data.size && recChunks.push(e.data);
    recorder.onstop = () => {
      stream.getTracks().forEach((t) => t.stop());
      btn.classList.remove("recording");
      $("record-label").textContent = "Record";
      $("mic-status").textContent = MIC_SUPPORTED ? "Or record first, then send" : "Push to record, release to speak";
      const blob = new Blob(recChunks, { type: recorder.mimeType || "audio/webm" });
      const ext = (recorder.mimeType || "").includes("ogg") ? "ogg" : "webm";
      setState(ns.state);
      speakBlob(blob, `recording.${ext}`);
    };
    recorder.start();
    btn.classList.add("recording");
    $("record-label").textContent = "Stop";
    $("mic-status").textContent = "Recording…";
    setState(ns.state);
  } catch (e) {
    fail(new Error(`Microphone unavailable: ${e.message || e}`));
  }
}

// Live microphone (livemic.js): 20 ms PCM frames to the session's audio socket as you talk.
const MIC_FLOOR_DB = -60;
let micShownDb = MIC_FLOOR_DB;

function micPercent(db) {
  return Math.max(0, Math.min(100, ((db - MIC_FLOOR_DB) / -MIC_FLOOR_DB) * 100));
}

function showMicLevel(db) {
  micShownDb = Math.max(db, micShownDb - 1.2); // fast attack, ~60 dB/s release
  const pct = `${micPercent(micShownDb).toFixed(1)}%`;
  $("mic-level-fill").style.width = pct;
  $("mic-tag-level").style.width = pct;
  $("mic-db").textContent = db > -119 ? `${db.toFixed(0)} dBFS` : "silence";
}

const MIC_TEXT = {
  off: ["Live mic", "Click to go live · hold to talk", "The presenter speaks while you are still talking."],
  starting: ["Starting…", "Opening the microphone…", "Allow microphone access if the browser asks."],
  listening: ["LIVE · Stop", "LIVE — listening", "Start talking; opening the mic does not cut the presenter off."],
  streaming: ["LIVE · Stop", "LIVE — streaming your voice", "Click (or release) to finish the sentence."],
  stopping: ["Stopping…", "Finishing the utterance…", ""],
};

function onMicPhase(phase) {
  const on = ["listening", "streaming", "stopping"].includes(phase);
  const btn = $("live-mic");
  const [label, status, sub] = MIC_TEXT[phase] || MIC_TEXT.off;
  btn.classList.toggle("live", on);
  btn.setAttribute("aria-pressed", String(on || phase === "starting"));
  $("live-label").textContent = label;
  $("live-status").textContent = status;
  $("live-sub").textContent = sub;
  $("stage").dataset.mic = phase;
  $("mic-tag-text").textContent = phase === "streaming" ? "MIC LIVE" : phase === "listening" ? "MIC LIVE · listening" : "MIC";
  $("mic-level").classList.toggle("on", on);
  if (phase === "streaming") log("Live mic: streaming your voice", "ok");
  if (phase === "off") {
    micShownDb = MIC_FLOOR_DB;
    showMicLevel(-120);
    $("mic-db").textContent = "mic off";
  }
}

async function startLiveMic() {
  if (liveMic || !ns.sessionId) return;
  const mic = new LiveMic({
    sessionId: ns.sessionId,
    onFrame: ({ db }) => showMicLevel(db),
    onPhase: (phase) => {
      onMicPhase(phase);
      if (phase === "off" && liveMic === mic) {
        liveMic = null;
        setState(ns.state);
      }
    },
    onError: fail,
  });
  liveMic = mic;
  ns.mic = mic.stats;
  setState(ns.state);
  try {
    await mic.start();
    if (mic.phase !== "off") log(`Live mic on (${mic.stats.sampleRate} Hz, ${mic.stats.frameSamples}-sample frames)`, "ok");
  } catch (e) {
    fail(new Error(`Live mic unavailable: ${e.message || e}`));
  }
}

async function stopLiveMic() {
  const mic = liveMic;
  if (!mic) return;
  const spoke = mic.stats.gateOpen;
  await mic.stop();
  const s = mic.stats;
  if (spoke) log(`Live mic off: ${((s.framesSent * s.frameSamples) / s.sampleRate).toFixed(1)} s streamed, utterance ended`, "ok");
  else log("Live mic off (no voice heard)");
}

// Click toggles; a press held longer than HOLD_MS is push-to-talk (release stops).
const HOLD_MS = 400;
let press = null;
function wireLiveMic() {
  const btn = $("live-mic");
  if (!MIC_SUPPORTED) {
    btn.title = "This browser has no AudioWorklet: use Record (the recording is sent when you stop)";
    $("live-status").textContent = "Live mic unsupported here";
    $("live-sub").textContent = "Use Record below: it sends the recording when you stop.";
    return;
  }
  btn.addEventListener("pointerdown", (e) => {
    if (btn.disabled || e.button !== 0) return;
    btn.setPointerCapture(e.pointerId);
    press = { t: performance.now(), started: !liveMic };
    if (!liveMic) startLiveMic();
  });
  const release = () => {
    if (!press) return;
    const held = performance.now() - press.t;
    if (liveMic && (!press.started || held > HOLD_MS)) stopLiveMic();
    press = null;
  };
  btn.addEventListener("pointerup", release);
  btn.addEventListener("pointercancel", release);
  btn.addEventListener("click", (e) => {
    if (e.detail !== 0 || btn.disabled) return; // keyboard (Enter / Space): toggle
    if (liveMic) stopLiveMic();
    else startLiveMic();
  });
}

// ------------------------------------------------------------------ wiring
$("connect").onclick = () => (["idle", "speaking", "buffering"].includes(ns.state) ? disconnect() : connect());
$("interrupt").onclick = interrupt;
$("say").onclick = say;
$("record").onclick = toggleRecord;
wireLiveMic();
$("file").onchange = () => {
  const f = $("file").files[0];
  $("file-name").textContent = f ? f.name : "Drop speech here or browse";
  setState(ns.state);
};
$("speak-file").onclick = () => {
  const f = $("file").files[0];
  if (f) speakBlob(f, f.name);
};
const drop = $("drop");
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => {
  e.preventDefault();
  drop.classList.remove("over");
  if (e.dataTransfer.files.length) {
    $("file").files = e.dataTransfer.files;
    $("file").onchange();
  }
});
for (const tab of document.querySelectorAll(".tab")) {
  tab.onclick = () => {
    for (const t of document.querySelectorAll(".tab")) t.classList.toggle("active", t === tab);
    for (const b of document.querySelectorAll(".tab-body")) b.classList.toggle("hidden", b.dataset.body !== tab.dataset.tab);
  };
}
$("line").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) say(); });
window.addEventListener("beforeunload", () => { if (ns.sessionId) navigator.sendBeacon && fetch(`/sessions/${ns.sessionId}`, { method: "DELETE", keepalive: true }); });

setState("disconnected");
loadServer();
loadAvatars();
setInterval(() => { if (ns.state === "disconnected") loadServer(); }, 10000);
