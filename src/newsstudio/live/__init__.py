"""Live sessions: an avatar that idles, speaks as speech arrives, and can be cut off at once.

Independent of HTTP, so it is testable alone; the server (`newsstudio.server`) only moves its
frames and samples over WebSocket/WebRTC.

Why the design looks like this:

* **One media clock.** Video frame k is shown at k/fps and output-audio sample s at s/sr,
  both measured from the same origin (`MediaClock`). Every position is an integer counter
  (frames, samples) and times are derived from counters, never accumulated from sleeps, so
  nothing drifts however long a session runs. The clock reads an injectable time source, so
  a test can run an hour of media without waiting an hour.
* **Pull, not push.** Consumers (a WebRTC video track, an audio track, a WebSocket pump) ask
  for "frame k" or "samples [s, s+n)"; the session renders what that media position holds:
  the idle loop (avatar frames, mouth closed) or the current utterance. Frames nobody pulls
  are never rendered, and a consumer that falls behind simply asks for a later position.
* **Utterances are placed on the timeline at a frame boundary F0**: video frame F0 + j shows
  the utterance's driving frame j, and its audio starts at sample frame_sample(F0) of the
  output stream. Audio and video of an utterance are therefore aligned by construction.
  Streamed speech that arrives late (underrun) is padded with silence *inside* the utterance,
  for both audio and mouth, so they stay aligned.
* **Barge-in.** New speech or `interrupt()` ends the current utterance at the consumers'
  current positions (the next frame / 20 ms audio block not yet handed out), drops frames
  rendered ahead, and the new utterance gets a fresh conditioner + driver.
* A session holds only per-stream state (conditioner, driver, a few rendered frames, PCM not
  yet played); the engine and the avatar's device tensors are shared and stay warm. `close()`
  drops everything the session holds.
"""
from .clock import OUT_RATE, MediaClock, ScaledTime, TimeSource
from .errors import SessionClosedError, SessionError, SessionLimitError
from .idle import IdleFrames
from .manager import SessionManager, evict_avatar
from .session import LiveSession, SessionStats
from .simulate import drive_simulated
from .utterance import Utterance, has_speech

__all__ = [
    "OUT_RATE", "IdleFrames", "LiveSession", "MediaClock", "ScaledTime", "SessionClosedError", "SessionError",
    "SessionLimitError", "SessionManager", "SessionStats", "TimeSource", "Utterance", "drive_simulated",
    "evict_avatar", "has_speech",
]
