"""Golden checks for the MuseTalk image side: crop boxes, BiSeNet, face parsing, blending,
frame mapping (README sections 2, 4, 5, 6). Every parameter comes from the case itself."""
from __future__ import annotations

import numpy as np
import torch

from golden.golden_io import assert_close, assert_uint8_close
from newsstudio.engines.musetalk import crop, frame_mapping


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _exact(name: str, out, ref: torch.Tensor) -> None:
    o = torch.as_tensor(np.asarray(out)).to(torch.int64)
    r = ref.to(torch.int64)
    assert tuple(o.shape) == tuple(r.shape), f"{name}: shape {tuple(o.shape)} != {tuple(r.shape)}"
    bad = (o != r).nonzero()
    assert bad.numel() == 0, f"{name}: {len(bad)} entries differ, first at {bad[0].tolist()}: {o[tuple(bad[0])]} vs {r[tuple(bad[0])]}"


def _all_outputs_checked(tensors: dict, checked: set[str]) -> None:
    missing = {k for k in tensors if k.startswith("out.")} - checked
    assert not missing, f"outputs not compared: {sorted(missing)}"


# ----------------------------------------------------------------------------------------- crop boxes

def check_crop_box_v15(t: dict, meta: dict) -> None:
    frame_h = int(meta["frame_hw"][0])
    coords, source = crop.face_boxes(t["in.face_landmarks"], t["in.det_boxes"], t["in.det_valid"], int(meta["bbox_shift"]))
    _exact("coords", coords, t["out.coords"])
    _exact("source", source, t["out.source"])
    boxes = crop.add_margin(coords, source, int(meta["extra_margin"]), frame_h)
    _exact("crop_box_v15", boxes, t["out.crop_box_v15"])
    # the v1.5 one-call form agrees when the case is a v1.5 run (bbox_shift forced to 0)
    if int(meta["bbox_shift"]) == 0:
        b2, s2 = crop.crop_boxes(t["in.face_landmarks"], t["in.det_boxes"], t["in.det_valid"], frame_h,
                                 version="v15", extra_margin=int(meta["extra_margin"]))
        _exact("crop_boxes(v15)", b2, t["out.crop_box_v15"])
        _exact("crop_boxes(v15) source", s2, t["out.source"])
    index = np.nonzero(source != int(crop.BoxSource.NONE))[0]
    _exact("crop_index", index, t["out.crop_index"])
    frames = _np(t["in.frames_bgr"])
    size = int(t["out.crop256_bgr"].shape[1])
    crops = np.stack([crop.crop_face(frames[i], boxes[i], size) for i in index])
    assert_uint8_close("crop256_bgr", crops, t["out.crop256_bgr"], max_abs=1, max_frac=0.005)
    _all_outputs_checked(t, {"out.coords", "out.source", "out.crop_box_v15", "out.crop_index", "out.crop256_bgr"})


def check_crop_box_v10_shift(t: dict, meta: dict) -> None:
    frame_h = int(meta["frame_hw"][0])
    shift = int(meta["bbox_shift"])
    coords, source = crop.crop_boxes(t["in.face_landmarks"], t["in.det_boxes"], t["in.det_valid"], frame_h,
                                     version="v1", bbox_shift=shift)
    if int(meta.get("extra_margin", 0)):
        coords = crop.add_margin(coords, source, int(meta["extra_margin"]), frame_h)
    _exact("coords", coords, t["out.coords"])
    _exact("source", source, t["out.source"])
    _all_outputs_checked(t, {"out.coords", "out.source"})


# ----------------------------------------------------------------------------------------- frame mapping

def check_frame_mapping(t: dict, meta: dict) -> None:
    n_avatar = int(meta["n_avatar_frames"])
    n_audio = int(meta["n_audio_frames"])
    bs = int(meta["batch_size"])
    delay = int(meta.get("delay_frame", 0))
    cycle = frame_mapping.ping_pong_cycle(n_avatar)
    _exact("cycle_source_frame", cycle, t["out.cycle_source_frame"])
    pos, src = frame_mapping.output_source_frames(n_audio, n_avatar)
    _exact("intended_cycle_pos", pos, t["out.intended_cycle_pos"])
    _exact("intended_source_frame", src, t["out.intended_source_frame"])
    # datagen: latents of every avatar frame (no placeholder here), shifted by delay_frame
    _exact("latent_cycle_pos", frame_mapping.cycle_positions(n_audio, len(cycle), delay), t["out.latent_cycle_pos"])
    _exact("batch_sizes", frame_mapping.batch_sizes(n_audio, bs), t["out.batch_sizes"])
    slices = frame_mapping.batch_slices(n_audio, bs)
    assert [s.stop - s.start for s in slices] == frame_mapping.batch_sizes(n_audio, bs)
    assert slices[0].start == 0 and slices[-1].stop == n_audio
    # The reference realtime thread blends output frames 0 .. n-2 only (its loop exits at
    # counter n-1): that is our intended mapping minus the last frame, which we do keep.
    ref_idx = t["out.reference_realtime_blended_output_index"]
    assert len(ref_idx) == n_audio - 1 and len(pos) == n_audio
    _exact("reference_realtime_blended_output_index", np.arange(n_audio)[: len(ref_idx)], ref_idx)
    _exact("reference_realtime_blended_cycle_pos", pos[_np(ref_idx)], t["out.reference_realtime_blended_cycle_pos"])
    _all_outputs_checked(t, {
        "out.cycle_source_frame", "out.intended_cycle_pos", "out.intended_source_frame", "out.latent_cycle_pos",
        "out.batch_sizes", "out.reference_realtime_blended_output_index", "out.reference_realtime_blended_cycle_pos",
    })


CHECKS = {
    "crop_box_v15": check_crop_box_v15,
    "crop_box_v10_shift": check_crop_box_v10_shift,
    "frame_mapping": check_frame_mapping,
}
