"""The web page in real headless Chromium: connect over WebRTC, speak an uploaded file, see
and hear it, interrupt it; stream the (fake, file-fed) microphone live. Skipped (with the
reason) where /usr/bin/chromium is absent."""
from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

import httpx
import numpy as np
import pytest

from newsstudio.server.app import ServerConfig, create_app

from conftest import MEDIA_DIR, media_path
from test_server import ServerThread

CHROMIUM = "/usr/bin/chromium"
HELLO = Path(__file__).resolve().parents[1] / "src" / "newsstudio" / "assets" / "hello.flac"
SCREENSHOT = Path("/tmp/newsstudio_page.png")
LIVE_SCREENSHOT = Path("/tmp/newsstudio_live_mic.png")
ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is absent (apt-get install chromium); the browser test needs it"),
]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    import torch

    threads = torch.get_num_threads()
    pytest.importorskip("playwright.async_api", reason="the playwright python package is not installed")
    from PIL import Image
    from skimage import data

    from newsstudio.avatar.prebake import prebake

    d = tmp_path_factory.mktemp("browser")
    Image.fromarray(data.astronaut()).save(d / "astronaut.png")
    prebake(d / "astronaut.png", "astro", root=d / "avatars", size=(256, 256), progress=False)
    cfg = ServerConfig(engine="classic", device="cpu", avatars=d / "avatars", clips=d / "clips", max_sessions=2)
    with ServerThread(create_app(cfg)) as srv:
        yield srv
    torch.set_num_threads(threads)


def speech_file() -> Path:
    """The real speech recording when ../shared/media has it, else the bundled espeak clip."""
    p = MEDIA_DIR / "speech.wav"
    return p if p.is_file() else HELLO


def window(history, t0, t1, key):
    return [h[key] for h in history if t0 <= h["t"] < t1 and h[key] is not None]


def test_page_connects_speaks_and_interrupts(site):
    from playwright.async_api import async_playwright

    async def run():
        profile = tempfile.mkdtemp(prefix="ns-chromium-")
        try:
            async with async_playwright() as p:
                ctx = await p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, args=ARGS, headless=True, viewport={"width": 1360, "height": 860})
                page = ctx.pages[0] if ctx.pages else await ctx.new_page()
                errors = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                await page.goto(site.url + "/")
                await page.wait_for_selector(".avatar[aria-selected='true']")
                assert await page.text_content("#state-text") == "Offline"
                await page.click("#connect")
                # video and audio arrive; the mouth baseline is taken while idle, once the VP8
                # encoder has ramped its bitrate up (~4 s of visible refinement before that)
                await page.wait_for_function("window.newsstudio.stats.framesDecoded > 110 && window.newsstudio.baseline !== null", timeout=30000)
                assert await page.text_content("#state-text") == "Idle"
                sid = await page.evaluate("window.newsstudio.sessionId")
                # the VP8 encoder refines a static picture for a few seconds (more under load);
                # wait until that settles, then the idle picture must stay still
                await page.wait_for_function("(() => { const v = window.newsstudio.history.filter(h => h.motion !== null).slice(-25); return v.length === 25 && v.every(h => h.motion < 0.5); })()", timeout=20000)
                await asyncio.sleep(1.5)
                now = await page.evaluate("performance.now()")
                hist = await page.evaluate("window.newsstudio.history")
                idle_mouth = window(hist, now - 1400, now, "motion")
                idle_rms = window(hist, now - 1400, now, "rms")
                assert len(idle_mouth) > 20 and len(idle_rms) > 20
                # identical frames go out while idle; only codec refreshes (a keyframe) may touch the region
                assert np.percentile(idle_mouth, 90) < 0.5 and max(idle_mouth) < 2.5, f"the mouth moves while idle: {np.percentile(idle_mouth, [50, 90, 100])}"
                assert max(idle_rms) < 0.005, "sound while idle"

                # speak an uploaded file through the page
                await page.set_input_files("#file", str(speech_file()))
                t_click = await page.evaluate("performance.now()")
                await page.click("#speak-file")
                await page.wait_for_function("window.newsstudio.history.some(h => h.t > %f && h.mouth > 8 && h.motion > 1.5)" % t_click, timeout=10000)
                await page.wait_for_function("window.newsstudio.history.some(h => h.t > %f && h.rms > 0.02)" % t_click, timeout=10000)
                await asyncio.sleep(2.5)
                await page.screenshot(path=str(SCREENSHOT))
                stats = await page.evaluate("window.newsstudio.stats")
                assert await page.text_content("#state-text") == "Speaking"

                # interrupt from the page (data channel)
                t_int = await page.evaluate("performance.now()")
                await page.click("#interrupt")
                await asyncio.sleep(1.5)
                hist = await page.evaluate("window.newsstudio.history")
                t_end = hist[-1]["t"]
                speak_mouth = window(hist, t_click, t_int, "mouth")
                speak_motion = window(hist, t_click, t_int, "motion")
                speak_rms = window(hist, t_click, t_int, "rms")
                moving = [h["t"] for h in hist if h["t"] > t_int and h["motion"] is not None and h["motion"] > 1.5]
                sounding = [h["t"] for h in hist if h["t"] > t_int and h["rms"] is not None and h["rms"] > 0.01]
                stop_video_ms = (moving[-1] - t_int) if moving else 0.0
                stop_audio_ms = (sounding[-1] - t_int) if sounding else 0.0
                after = t_int + 600
                still_mouth = window(hist, after, t_end, "mouth")
                still_motion = window(hist, after, t_end, "motion")
                still_rms = window(hist, after, t_end, "rms")
                server_info = httpx.get(f"{site.url}/sessions/{sid}").json()
                events = await page.evaluate("window.newsstudio.events.map(e => e.text)")
                state_after = await page.text_content("#state-text")

                # a recording from the (fake) microphone, through MediaRecorder and an upload
                await page.click(".tab[data-tab='mic']")
                t_rec = await page.evaluate("performance.now()")
                await page.click("#record")
                await asyncio.sleep(2.0)
                await page.click("#record")
                await page.wait_for_function("window.newsstudio.events.some(e => e.text.startsWith('Speaking recording.'))", timeout=15000)
                await page.wait_for_function("window.newsstudio.history.some(h => h.t > %f && h.rms > 0.01)" % t_rec, timeout=10000)
                await page.click("#interrupt")
                # a typed line, when the server has a TTS
                tts = await page.evaluate("window.newsstudio.tts")
                if tts:
                    await page.click(".tab[data-tab='text']")
                    await page.fill("#line", "Good evening. Here are tonight's headlines.")
                    t_say = await page.evaluate("performance.now()")
                    await page.click("#say")
                    await page.wait_for_function("window.newsstudio.events.some(e => e.text.startsWith('Saying'))", timeout=15000)
                    await page.wait_for_function("window.newsstudio.history.some(h => h.t > %f && h.motion > 1.5)" % t_say, timeout=10000)
                    await page.click("#interrupt")
                else:
                    assert await page.is_disabled("#say")

                # disconnect frees the session on the server
                await page.click("#connect")
                for _ in range(100):
                    if httpx.get(f"{site.url}/metrics").json()["active_sessions"] == 0:
                        break
                    await asyncio.sleep(0.05)
                active = httpx.get(f"{site.url}/metrics").json()["active_sessions"]
                await ctx.close()
                return locals()
        finally:
            shutil.rmtree(profile, ignore_errors=True)

    r = asyncio.run(run())
    assert not r["errors"], r["errors"]
    st = r["stats"]
    assert st["fps"] > 18 and st["codec"] in ("VP8", "H264") and (st["width"], st["height"]) == (256, 256), st
    assert st["audioSamples"] > 48000
    # speech: the mouth moves and sound plays
    sm, sr = r["speak_mouth"], r["speak_rms"]
    assert sum(m > 6 for m in sm) > 0.3 * len(sm), "the mouth barely opened while speaking"
    assert np.median(r["speak_motion"]) > 2.0, "the mouth barely moved while speaking"
    assert sum(x > 0.02 for x in sr) > 0.3 * len(sr), "little sound while speaking"
    # interrupt: motion and sound stop within the bound (media cut <= 100 ms on the server,
    # plus the data channel hop, WebRTC jitter buffer and the page's 25 ms sampling)
    assert r["server_info"]["last_cut_ms"] is not None and r["server_info"]["last_cut_ms"] <= 100
    assert r["stop_video_ms"] <= 400, f"the mouth still moved {r['stop_video_ms']:.0f} ms after the interrupt click"
    # audio: Chromium's adaptive jitter buffer sits behind the server's cut (asserted above, <= 100 ms);
    # measured on the 2-core CI box: 30-194 ms with this file alone, 132-479 ms after the accel/batching
    # tests, 431-574 ms in the full suite (2026-12-02 to 12-04), so the page-side bound is 700 ms
    assert r["stop_audio_ms"] <= 700, f"sound still played {r['stop_audio_ms']:.0f} ms after the interrupt click"
    # afterwards the mouth stays still (VP8 leaves a small static error against the idle baseline)
    assert np.percentile(r["still_motion"], 90) < 0.5 and max(r["still_motion"]) < 2.5, r["still_motion"]
    assert max(r["still_mouth"]) < 6.0, r["still_mouth"]
    assert max(r["still_rms"]) < 0.005
    assert r["state_after"] == "Idle"
    assert any("Interrupted" in e for e in r["events"])
    assert r["active"] == 0
    assert SCREENSHOT.is_file() and SCREENSHOT.stat().st_size > 20_000
    print(f"interrupt -> mouth still after {r['stop_video_ms']:.0f} ms, silence after {r['stop_audio_ms']:.0f} ms; page stats {st}")


def fake_mic_wav(tmp_path: Path) -> Path:
    """Speech for Chromium's fake microphone (--use-file-for-fake-audio-capture): the real
    recording from ../shared/media when present, else the bundled clip, as 48 kHz mono s16 WAV."""
    import av

    src = media_path("speech.wav") if (MEDIA_DIR / "speech.wav").is_file() else HELLO
    out = tmp_path / "mic.wav"
    resampler = av.AudioResampler(format="s16", layout="mono", rate=48000)
    with av.open(str(src)) as inp, av.open(str(out), "w", format="wav") as wav:
        stream = wav.add_stream("pcm_s16le", rate=48000, layout="mono")
        for frame in inp.decode(audio=0):
            frame.pts = None
            for f in resampler.resample(frame):
                wav.mux(stream.encode(f))
        for f in resampler.resample(None):
            wav.mux(stream.encode(f))
        wav.mux(stream.encode(None))
    return out


def test_page_streams_the_live_microphone(site, tmp_path):
    """Live mic: 20 ms PCM frames from an AudioWorklet reach the session's audio socket while the
    mic is on; the presenter speaks (sound and mouth) before the user stops; stopping ends the
    utterance (back to idle); talking over the presenter barges in."""
    from playwright.async_api import async_playwright

    wav = fake_mic_wav(tmp_path)
    args = ARGS + [f"--use-file-for-fake-audio-capture={wav}"]

    def info(sid):
        return httpx.get(f"{site.url}/sessions/{sid}").json()

    async def run():
        profile = tempfile.mkdtemp(prefix="ns-chromium-")
        try:
            async with async_playwright() as p:
                ctx = await p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, args=args, headless=True, viewport={"width": 1360, "height": 860})
                page = ctx.pages[0] if ctx.pages else await ctx.new_page()
                errors = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                await page.goto(site.url + "/")
                await page.wait_for_selector(".avatar[aria-selected='true']")
                await page.click(".tab[data-tab='mic']")
                assert await page.is_disabled("#live-mic"), "live mic enabled without a session"
                await page.click("#connect")
                await page.wait_for_function("window.newsstudio.stats.framesDecoded > 110 && window.newsstudio.baseline !== null", timeout=30000)
                await page.wait_for_function("(() => { const v = window.newsstudio.history.filter(h => h.motion !== null).slice(-25); return v.length === 25 && v.every(h => h.motion < 0.5); })()", timeout=20000)
                sid = await page.evaluate("window.newsstudio.sessionId")
                before = info(sid)
                assert before["state"] == "idle"

                # mic on (a click toggles it)
                await page.click("#live-mic")
                await page.wait_for_function("window.newsstudio.mic.phase === 'streaming'", timeout=10000)
                t_voice = await page.evaluate("window.newsstudio.mic.firstVoiceAt")
                # the server speaks while the mic is still on
                samples = []
                t0 = await page.evaluate("performance.now()")
                while True:
                    s = info(sid)
                    tp, mic, meter = await page.evaluate("[performance.now(), window.newsstudio.mic, parseFloat(document.getElementById('mic-level-fill').style.width)]")
                    samples.append((tp, s, dict(mic, meter=meter)))
                    if tp - t0 > 4500:
                        break
                    await asyncio.sleep(0.25)
                await page.screenshot(path=str(LIVE_SCREENSHOT))
                live_ui = {
                    "button": await page.text_content("#live-mic"),
                    "pressed": await page.get_attribute("#live-mic", "aria-pressed"),
                    "tag_visible": await page.is_visible("#mic-tag"),
                    "tag": await page.text_content("#mic-tag"),
                }
                # mic off: the utterance ends, the presenter plays out what arrived and idles
                t_stop = await page.evaluate("performance.now()")
                await page.click("#live-mic")
                await page.wait_for_function("window.newsstudio.mic.phase === 'off'", timeout=5000)
                # the close handshake needs the server's reply: give it a moment on a loaded machine
                await page.wait_for_function("window.newsstudio.mic.socket === 'closed'", timeout=3000)
                mic_after = await page.evaluate("window.newsstudio.mic")
                idle_after = None
                for _ in range(100):
                    s = info(sid)
                    if s["state"] == "idle":
                        idle_after = (await page.evaluate("performance.now()")) - t_stop
                        break
                    await asyncio.sleep(0.1)
                after_stop = info(sid)
                hist = await page.evaluate("window.newsstudio.history")
                await asyncio.sleep(1.0)
                page_state = await page.text_content("#state-text")
                tag_after = await page.is_visible("#mic-tag")

                # talking over the presenter barges in (the server's rule: new speech cuts it off)
                await page.click(".tab[data-tab='file']")
                await page.set_input_files("#file", str(speech_file()))
                await page.click("#speak-file")
                for _ in range(100):
                    if info(sid)["state"] == "speaking":
                        break
                    await asyncio.sleep(0.05)
                file_speaking = info(sid)
                await page.click(".tab[data-tab='mic']")
                # this time push-to-talk: hold the button while talking, release to stop
                await page.hover("#live-mic")
                await page.mouse.down()
                await page.wait_for_function("window.newsstudio.mic.phase === 'streaming'", timeout=10000)
                await asyncio.sleep(1.0)
                barged = info(sid)
                held_phase = await page.evaluate("window.newsstudio.mic.phase")
                await page.mouse.up()
                await page.wait_for_function("window.newsstudio.mic.phase === 'off'", timeout=5000)
                for _ in range(100):
                    if info(sid)["state"] == "idle":
                        break
                    await asyncio.sleep(0.1)
                final = info(sid)
                events = await page.evaluate("window.newsstudio.events.map(e => e.text)")
                await page.click("#connect")
                # without AudioWorklet the page keeps record-then-upload and says why
                old = await ctx.new_page()
                await old.add_init_script("delete window.AudioWorkletNode")
                await old.goto(site.url + "/")
                await old.wait_for_selector(".avatar[aria-selected='true']")
                fallback = {"live_disabled": await old.is_disabled("#live-mic"), "status": await old.text_content("#live-status"), "record": await old.locator("#record").count()}
                await ctx.close()
                return locals()
        finally:
            shutil.rmtree(profile, ignore_errors=True)

    r = asyncio.run(run())
    assert not r["errors"], r["errors"]
    before, samples, t_voice, t_stop = r["before"], r["samples"], r["t_voice"], r["t_stop"]
    for tp, s, mic in samples:
        print(f"{tp - t_voice:7.0f} ms  {s['state']:9s} utt={s['utterances']} speech_frames={s['speech_frames']} underrun={s['underrun_ms']} mic={mic['phase']} sent={mic['framesSent']} db={mic['levelDb']:.0f} meter={mic['meter']:.0f}%")
    # on the server, while the mic was still on: one new streamed utterance, speaking, and
    # speech frames rendered from it (the upload path would only have started after the stop)
    assert all(m["phase"] == "streaming" for _, _, m in samples)
    speaking = [tp for tp, s, _ in samples if s["state"] == "speaking"]
    assert speaking and speaking[0] - t_voice < 2000, "the presenter did not start speaking while the user talked"
    last = samples[-1][1]
    assert last["state"] == "speaking" and last["utterances"] == before["utterances"] + 1, last
    assert last["speech_frames"] - before["speech_frames"] >= 50, "fewer than 2 s of speech frames rendered while the mic was on"
    assert not any(e.startswith("Speaking recording") for e in r["events"]), "the live mic fell back to record-and-upload"
    mic = samples[-1][2]
    # the page streams 20 ms frames of 16-bit PCM at the rate it tells the socket
    assert mic["sampleRate"] == 48000 and mic["frameSamples"] == 960, mic
    assert mic["framesSent"] >= 0.7 * (samples[-1][0] - t_voice) / 20, mic
    assert mic["bytesSent"] == 2 * 960 * mic["framesSent"]
    # the page saw and heard it before the stop: the mouth moved, sound came back
    hist = r["hist"]
    t_a = speaking[0] + 300
    mouth = window(hist, t_a, t_stop, "mouth")
    motion = window(hist, t_a, t_stop, "motion")
    rms = window(hist, t_a, t_stop, "rms")
    print(f"live: mouth p50/p90 {np.percentile(mouth, [50, 90])}, motion p50 {np.median(motion):.2f}, rms>0.02 {np.mean([x > 0.02 for x in rms]):.2f}; idle {r['idle_after']} ms after the stop; ui {r['live_ui']}")
    assert len(mouth) > 40 and sum(m > 6 for m in mouth) > 0.3 * len(mouth), "the mouth barely opened while the mic streamed"
    assert np.median(motion) > 1.5, "the mouth barely moved while the mic streamed"
    assert sum(x > 0.02 for x in rms) > 0.3 * len(rms), "little sound came back while the mic streamed"
    # a clear LIVE state and a moving input meter
    ui = r["live_ui"]
    assert "LIVE" in ui["button"] and ui["pressed"] == "true" and ui["tag_visible"] and "MIC LIVE" in ui["tag"], ui
    meter = [m["meter"] for _, _, m in samples]
    assert max(meter) > 50 and max(meter) - min(meter) > 20, f"the input meter did not follow the voice: {meter}"
    # mic off: speech_end sent, the session idles (what arrived plays out first), nothing new starts
    assert r["mic_after"]["speechEndSent"] and r["mic_after"]["socket"] == "closed", r["mic_after"]
    assert r["idle_after"] is not None and r["idle_after"] < 4000, f"session still {r['after_stop']['state']} after the mic stopped"
    assert r["after_stop"]["utterances"] == last["utterances"]
    assert r["page_state"] == "Idle" and not r["tag_after"]
    # barge-in: the live mic over file speech cut it and took over
    fs, b = r["file_speaking"], r["barged"]
    assert fs["state"] == "speaking"
    assert b["barge_ins"] == fs["barge_ins"] + 1 and b["utterances"] == fs["utterances"] + 1 and b["state"] == "speaking", (fs, b)
    assert r["held_phase"] == "streaming" and r["final"]["state"] == "idle"
    fb = r["fallback"]
    assert fb["live_disabled"] and "unsupported" in fb["status"] and fb["record"] == 1, fb
    assert LIVE_SCREENSHOT.is_file() and LIVE_SCREENSHOT.stat().st_size > 20_000


def test_page_says_when_the_server_has_stalled(tmp_path):
    """A server whose shared batch hangs answers /health with 503: the page names the stall and what
    to do, instead of calling the server unreachable."""
    import threading

    import torch
    from playwright.async_api import async_playwright

    from newsstudio.avatar.prebake import prebake
    from PIL import Image
    from skimage import data

    Image.fromarray(data.astronaut()).save(tmp_path / "astronaut.png")
    prebake(tmp_path / "astronaut.png", "astro", root=tmp_path / "avatars", size=(256, 256), progress=False)
    cfg = ServerConfig(engine="classic", device="cpu", avatars=tmp_path / "avatars", clips=tmp_path / "clips",
                       max_sessions=2, batch_stall_s=0.3)
    app = create_app(cfg)
    gate = threading.Event()
    with ServerThread(app) as srv:
        engines = app.state.ns.engines
        _, eng = engines.get("classic")
        eng.render_many = lambda items: gate.wait(60) and []  # the device never finishes this batch
        render_batcher = engines.render_batcher("classic")  # made as the first live session makes it
        render_batcher.submit(None, None, torch.zeros(1))
        try:
            async def run():
                profile = tempfile.mkdtemp(prefix="ns-chromium-")
                try:
                    async with async_playwright() as p:
                        ctx = await p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, args=ARGS, headless=True)
                        page = ctx.pages[0] if ctx.pages else await ctx.new_page()
                        await asyncio.sleep(0.6)  # past the stall limit
                        await page.goto(srv.url + "/")
                        await page.wait_for_function("document.querySelector('#server-status').className.includes('bad')", timeout=10000)
                        label = await page.text_content("#server-status .label")
                        await ctx.close()
                        return label
                finally:
                    shutil.rmtree(profile, ignore_errors=True)

            label = asyncio.run(run())
        finally:
            gate.set()
    assert "stalled (classic)" in label and "restart" in label, label
