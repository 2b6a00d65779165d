"""Text to speech for the page's "type a line" box: espeak-ng when it is installed."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from ..media.audio import Audio, load_audio


class TtsUnavailable(RuntimeError):
    pass


class EspeakTts:
    name = "espeak-ng"

    def __init__(self, binary: str | None = None):
        self.binary = binary or shutil.which("espeak-ng") or shutil.which("espeak")

    @property
    def available(self) -> bool:
        return self.binary is not None

    def info(self) -> dict:
        if self.available:
            return {"available": True, "engine": self.name, "reason": None}
        return {"available": False, "engine": None, "reason": "no TTS configured: install espeak-ng (apt-get install espeak-ng) to type lines"}

    def synthesize(self, text: str, voice: str | None = None, timeout: float = 20.0) -> Audio:
        if not self.available:
            raise TtsUnavailable(self.info()["reason"])
        fd, path = tempfile.mkstemp(prefix="newsstudio-tts-", suffix=".wav")
        os.close(fd)
        try:
            # a file, not --stdout: espeak-ng's piped WAV header announces an unbounded length
            cmd = [self.binary, "-w", path, "-s", "160"]
            if voice:
                cmd += ["-v", voice]
            # the text goes on stdin, never through a shell or as an option
            proc = subprocess.run(cmd, input=text.encode("utf-8"), capture_output=True, timeout=timeout, check=False)
            if proc.returncode != 0:
                raise TtsUnavailable(f"espeak-ng failed: {proc.stderr.decode(errors='replace').strip()[:200]}")
            return load_audio(path)
        finally:
            os.unlink(path)
