"""media: decoding and encoding files, on PyAV (FFmpeg in the wheel; no ffmpeg binary needed).

- ``errors``: the ``MediaError(ValueError)`` family; every bad input names the file and the problem.
- ``video``: ``probe_video`` / ``iter_video_frames`` (RGB, display rotation applied).
- ``image``: ``read_image`` (EXIF-transposed RGB, alpha over white) and ``is_image_path``.
- ``audio``: the ``Audio`` container (float32 [channels, n]), ``load_audio``, ``audio_from_array``,
  ``write_wav``.
- ``mp4_writer``: ``Mp4Writer`` / ``encode_clip``: frame-exact H.264 + AAC, atomic.
"""
