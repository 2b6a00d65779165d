"""Golden checks for the MuseTalk image side: crop boxes, BiSeNet, face parsing, blending,
frame mapping (README sections 2, 4, 5, 6). Every parameter comes from the case itself."""
from __future__ import annotations

import cv2
import numpy as np
import torch

from golden.golden_io import assert_close, assert_uint8_close
from newsstudio.engines.musetalk import blend, crop, face_parsing, frame_mapping
from newsstudio.engines.musetalk.bisenet import BiSeNet, normalize_rgb
from newsstudio.weights.seeded import fill_seeded_


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


# ----------------------------------------------------------------------------------------- BiSeNet / parsing

def _seeded_bisenet(salt: int) -> BiSeNet:
    return fill_seeded_(BiSeNet(), salt).eval()


def _frac_differ(name: str, out, ref: torch.Tensor, max_frac: float) -> np.ndarray:
    o = np.asarray(out)
    r = _np(ref)
    assert o.shape == r.shape, f"{name}: shape {o.shape} != {r.shape}"
    diff = o != r
    assert diff.mean() <= max_frac, f"{name}: {diff.mean():.4%} differ > {max_frac:.4%}"
    return diff


def check_bisenet_forward(t: dict, meta: dict) -> None:
    net = _seeded_bisenet(int(meta["weight_salt"]))
    x = normalize_rgb(_np(t["in.image_rgb"]))
    assert_close("input_normalized", x, t["out.input_normalized"], 1e-4)
    with torch.no_grad():
        maps = net(x)
    for name, m in zip(("logits", "logits16", "logits32"), maps):
        assert_close(name, m, t[f"out.{name}"], 1e-4)
    _frac_differ("argmax", maps[0][0].argmax(0).to(torch.uint8).numpy(), t["out.argmax"], 0.005)
    _all_outputs_checked(t, {"out.input_normalized", "out.logits", "out.logits16", "out.logits32", "out.argmax"})


def _cheek_widths(meta: dict, default: tuple[int, int]) -> tuple[int, int]:
    if "cheek_widths" in meta:
        return int(meta["cheek_widths"][0]), int(meta["cheek_widths"][1])
    return int(meta.get("left_cheek_width", default[0])), int(meta.get("right_cheek_width", default[1]))


def _far_from(diff: np.ndarray, radius: int) -> np.ndarray:
    """Pixels farther than `radius` (Chebyshev) from any True pixel of `diff`."""
    near = cv2.dilate(diff.astype(np.uint8), np.ones((2 * radius + 1, 2 * radius + 1), np.uint8))
    return near == 0


def check_faceparsing_call(t: dict, meta: dict) -> None:
    # README 4b: FaceParsing with the v1.5 scripts' cheek widths (90/90) unless the metadata says otherwise
    left, right = _cheek_widths(meta, (90, 90))
    parser = face_parsing.FaceParser(_seeded_bisenet(int(meta["weight_salt"])), left, right)
    image = _np(t["in.crop_rgb"])
    size = int(t["out.resized512_rgb"].shape[0])
    resized = face_parsing.resize_for_parsing(image, size)
    assert_uint8_close("resized512_rgb", resized, t["out.resized512_rgb"], max_abs=1, max_frac=0.005)
    argmax = parser.parse_resized(resized)
    diff = _frac_differ("argmax512", argmax, t["out.argmax512"], 0.001)
    h, w = image.shape[:2]
    checked = {"out.resized512_rgb", "out.argmax512"}
    for key in t:
        if not key.startswith("out.mask512_"):
            continue
        mode = key.removeprefix("out.mask512_")
        # from the golden argmax: identical
        gold_mask = parser.mask(_np(t["out.argmax512"]), mode)
        _exact(f"mask512_{mode} (golden argmax)", gold_mask, t[key])
        seg_key = f"out.face_seg_{mode}"
        assert_uint8_close(f"face_seg_{mode} (golden argmax)", face_parsing.resize_mask(gold_mask, w, h), t[seg_key], 1, 1.0)
        # from our own argmax: equal wherever the argmax agrees (jaw mode: morphology reaches
        # 16 px for the cone dilation plus 2x17 px for the cheek erosion)
        own_mask = parser.mask(argmax, mode)
        agree = _far_from(diff, 16 + 2 * 17) if mode == "jaw" else ~diff
        assert np.array_equal(own_mask[agree], _np(t[key])[agree]), f"mask512_{mode} differs where the argmax agrees"
        if not diff.any():
            assert_uint8_close(f"face_seg_{mode}", parser.face_seg(image, mode), t[seg_key], 1, 1.0)
        checked |= {key, seg_key}
    _all_outputs_checked(t, checked)


# ----------------------------------------------------------------------------------------- blending

def check_blend(t: dict, meta: dict) -> None:
    face_box = [int(v) for v in _np(t["in.face_box"])]
    expand = float(meta["expand"])
    ratio = float(meta["upper_boundary_ratio"])
    frame = _np(t["in.frame_bgr"])
    parsing = _np(t["in.parsing512"])
    crop_box, s = blend.expanded_crop_box(face_box, expand)
    _exact("crop_box", crop_box, t["out.crop_box"])
    face = blend.resize_face(_np(t["in.face256_bgr"]), face_box)
    assert_uint8_close("face_resized", face, t["out.face_resized"], 2, 0.005)
    checked = {"out.crop_box", "out.face_resized"}
    for mode in meta["modes"]:
        # README 5: jaw runs with the v1.5 widths 90/90, raw with the class defaults 80/80 (unused by raw)
        left, right = (int(v) for v in meta.get(f"cheek_widths_{mode}", (90, 90) if mode == "jaw" else (80, 80)))
        mask512 = face_parsing.parsing_to_mask(parsing, mode, left, right)
        _frac_differ(f"fp_mask512_{mode}", mask512, t[f"out.fp_mask512_{mode}"], 0.001)
        pre = blend.place_mask(mask512, face_box, crop_box, ratio)
        _frac_differ(f"mask_preblur_{mode}", pre, t[f"out.mask_preblur_{mode}"], 0.001)
        # realtime path: get_image_prepare_material + get_image_blending
        k_rt = blend.blur_ksize(2 * s, blend.REALTIME_BLUR_FRACTION)
        assert k_rt == int(meta.get(f"blur_ksize_prepare_material_{mode}", k_rt)), (k_rt, meta)
        prep, cb = blend.prepare_mask(mask512, face_box, blend.REALTIME_BLUR_FRACTION, ratio, expand)
        assert cb == crop_box
        assert_uint8_close(f"prep_mask_{mode}", prep, t[f"out.prep_mask_{mode}"], 2, 0.005)
        out_rt = blend.composite_pil(frame, face, face_box, prep, crop_box)
        assert_uint8_close(f"blend_realtime_{mode}", out_rt, t[f"out.blend_realtime_{mode}"], 2, 0.005)
        # the GPU form gives the same frame up to rounding
        cb2, alpha = blend.blend_material(face_box, prep, expand)
        out_t = blend.composite_torch(torch.from_numpy(frame), torch.from_numpy(face), face_box, cb2, alpha)
        assert_uint8_close(f"blend_realtime_{mode} (torch)", out_t, t[f"out.blend_realtime_{mode}"], 2, 1.0)
        # offline path: get_image
        k_off = blend.blur_ksize(2 * s, blend.OFFLINE_BLUR_FRACTION)
        assert k_off == int(meta.get(f"blur_ksize_get_image_{mode}", k_off)), (k_off, meta)
        out_off = blend.blend_offline(frame, face, face_box, mask512, ratio, expand)
        assert_uint8_close(f"blend_getimage_{mode}", out_off, t[f"out.blend_getimage_{mode}"], 2, 0.005)
        checked |= {f"out.{k}_{mode}" for k in ("fp_mask512", "mask_preblur", "prep_mask", "blend_realtime", "blend_getimage")}
    _all_outputs_checked(t, checked)


CHECKS = {
    "crop_box_v15": check_crop_box_v15,
    "crop_box_v10_shift": check_crop_box_v10_shift,
    "frame_mapping": check_frame_mapping,
    "bisenet_forward": check_bisenet_forward,
    "faceparsing_call": check_faceparsing_call,
    "blend": check_blend,
}
