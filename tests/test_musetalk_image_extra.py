"""MuseTalk image side beyond the golden cases: the GPU-form composite against PIL, the landmark
jaw mask (no BiSeNet weights), BiSeNet keys and checkpoint loading, crop/frame-mapping rules."""
from __future__ import annotations

import json
import math
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from newsstudio.engines.musetalk import blend, crop, face_parsing, frame_mapping, landmark_mask
from newsstudio.engines.musetalk.bisenet import BiSeNet, load_bisenet, load_bisenet_state_dict, normalize_rgb
from newsstudio.weights.seeded import fill_seeded_

GOLDEN = Path(__file__).resolve().parents[1].parent / "shared" / "golden" / "musetalk"
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def synthetic_landmarks(cx: float, cy: float, scale: float) -> np.ndarray:
    """A plausible frontal 68-point iBUG face (jaw, brows, nose, eyes, mouth) around (cx, cy)."""
    p = np.zeros((68, 2))
    for i in range(17):  # jaw: left ear level -> chin -> right ear level
        th = math.pi - i * math.pi / 16
        p[i] = (cx + 1.0 * scale * math.cos(th), cy + 0.15 * scale + 1.05 * scale * math.sin(th))
    for i in range(5):  # brows
        p[17 + i] = (cx - 0.75 * scale + 0.14 * scale * i, cy - 0.55 * scale - 0.05 * scale * math.sin(i * math.pi / 4))
        p[22 + i] = (cx + 0.19 * scale + 0.14 * scale * i, cy - 0.55 * scale - 0.05 * scale * math.sin((4 - i) * math.pi / 4))
    for i in range(4):  # nose bridge 27..30
        p[27 + i] = (cx, cy - 0.35 * scale + 0.14 * scale * i)
    for i in range(5):  # nose bottom 31..35
        p[31 + i] = (cx - 0.18 * scale + 0.09 * scale * i, cy + 0.2 * scale + 0.03 * scale * (1 - abs(i - 2) / 2))
    for e, ex in enumerate((cx - 0.4 * scale, cx + 0.4 * scale)):  # eyes 36..47
        for i in range(6):
            th = math.pi - i * math.pi / 3
            p[36 + 6 * e + i] = (ex + 0.15 * scale * math.cos(th), cy - 0.3 * scale - 0.06 * scale * math.sin(th))
    for i in range(12):  # outer lips 48..59
        th = math.pi - i * math.pi / 6
        p[48 + i] = (cx + 0.35 * scale * math.cos(th), cy + 0.5 * scale - 0.15 * scale * math.sin(th))
    for i in range(8):  # inner lips 60..67
        th = math.pi - i * math.pi / 4
        p[60 + i] = (cx + 0.25 * scale * math.cos(th), cy + 0.5 * scale - 0.05 * scale * math.sin(th))
    return p.astype(np.float32)


# ------------------------------------------------------------------------------ GPU-form composite

def _random_mask(rng: np.random.Generator, size: int) -> np.ndarray:
    m = np.zeros((size, size), np.uint8)
    for _ in range(4):
        c = tuple(int(v) for v in rng.integers(0, size, 2))
        axes = tuple(int(v) for v in rng.integers(size // 8, size // 2, 2))
        cv2.ellipse(m, c, axes, float(rng.uniform(0, 180)), 0, 360, 255, -1)
    k = blend.blur_ksize(size, blend.REALTIME_BLUR_FRACTION)
    return blend.feather(m, k)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(6))
def test_torch_composite_matches_pil(seed, device):
    rng = np.random.default_rng(seed)
    H, W = int(rng.integers(120, 260)), int(rng.integers(120, 260))
    w, h = int(rng.integers(20, 110)), int(rng.integers(20, 110))
    # boxes anywhere, including partly outside the frame (x2/y2 beyond the border, top-left corner)
    x1, y1 = int(rng.integers(0, W - 10)), int(rng.integers(0, H - 10))
    face_box = (x1, y1, x1 + w, y1 + h)
    crop_box, s = blend.expanded_crop_box(face_box)
    frame = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
    face = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    mask = _random_mask(rng, 2 * s)
    ref = blend.composite_pil(frame, face, face_box, mask, crop_box)

    cb, alpha = blend.blend_material(face_box, mask, device=device)
    assert cb == crop_box and alpha.shape == (2 * s, 2 * s)
    assert alpha.dtype == torch.float32 and alpha.device.type == device
    assert 0.0 <= alpha.min().item() and alpha.max().item() <= 1.0
    out = blend.composite_torch(torch.from_numpy(frame).to(device), torch.from_numpy(face).to(device), face_box, cb, alpha)
    assert out.device.type == device and out.dtype == torch.uint8
    d = (out.cpu().to(torch.int16) - torch.from_numpy(ref).to(torch.int16)).abs()
    assert d.max().item() <= 2
    # the composite really changed the frame where the mask is on (the test can fail)
    assert (torch.from_numpy(ref) != torch.from_numpy(frame)).any()


def test_torch_composite_needs_matching_mask():
    with pytest.raises(ValueError):
        blend.blend_material((10, 10, 50, 60), np.zeros((10, 10), np.uint8))


def test_face_alpha_is_face_box_part():
    face_box = (30, 40, 90, 120)
    crop_box, s = blend.expanded_crop_box(face_box)
    alpha = torch.rand(2 * s, 2 * s)
    a = blend.face_alpha(face_box, crop_box, alpha)
    assert a.shape == (80, 60)
    xs, ys = crop_box[:2]
    assert torch.equal(a, alpha[40 - ys : 120 - ys, 30 - xs : 90 - xs])


# ------------------------------------------------------------------------------ landmark jaw mask

@pytest.mark.parametrize("cx,cy,scale", [(200.0, 180.0, 60.0), (90.0, 70.0, 45.0), (300.5, 260.25, 110.0)])
def test_landmark_jaw_mask(cx, cy, scale):
    lm = synthetic_landmarks(cx, cy, scale)
    frame_h = 520
    boxes, src = crop.crop_boxes(lm[None], np.array([[0, 0, 1, 1]]), np.array([True]), frame_h)
    assert src[0] == crop.BoxSource.LANDMARK
    face_box = tuple(int(v) for v in boxes[0])
    mask, crop_box = landmark_mask.landmark_prepare_mask(lm, face_box)
    xs, ys, xe, ye = crop_box
    assert mask.shape == (ye - ys, xe - xs) and mask.dtype == np.uint8
    # covers the mouth
    mouth = np.round(lm[48:68] - np.array([xs, ys])).astype(int)
    assert mask[mouth[:, 1], mouth[:, 0]].min() >= 200
    # zero above the nose (what the blur may bleed upwards is at most half its kernel)
    k = blend.blur_ksize(xe - xs, blend.REALTIME_BLUR_FRACTION)
    nose_top = int(lm[31:36, 1].min()) - ys
    assert not mask[: max(0, nose_top - k // 2 - 1)].any()
    assert not mask[: int((ye - ys) * blend.UPPER_BOUNDARY_RATIO) - k // 2 - 1].any()
    # nothing far outside the jaw
    jaw_bottom = int(lm[:17, 1].max()) - ys
    assert not mask[jaw_bottom + k // 2 + 2 :].any()
    # feathered: a band of intermediate values, and the core is fully on
    inter = ((mask > 0) & (mask < 255)).sum()
    assert inter > 0.1 * (mask == 255).sum()
    assert (mask == 255).sum() > 0


def test_landmark_mask_follows_face():
    a = landmark_mask.landmark_mask512(synthetic_landmarks(100, 100, 40), (40, 40, 160, 160))
    b = landmark_mask.landmark_mask512(synthetic_landmarks(110, 100, 40), (40, 40, 160, 160))
    assert a.any() and not np.array_equal(a, b)
    cols_a = np.nonzero(a.any(0))[0]
    cols_b = np.nonzero(b.any(0))[0]
    assert cols_b.mean() > cols_a.mean()  # moved right with the face


# ------------------------------------------------------------------------------ BiSeNet

def test_bisenet_manifest_keys_and_shapes():
    path = GOLDEN / "bisenet_state_dict_manifest.json"
    if not path.exists():
        pytest.skip(f"{path} absent")
    manifest = json.loads(path.read_text())
    sd = BiSeNet().state_dict()
    assert list(sd) == list(manifest)
    for k, v in sd.items():
        assert list(v.shape) == manifest[k]["shape"], k
        assert str(v.dtype).removeprefix("torch.") == manifest[k]["dtype"], k


@pytest.fixture(scope="module")
def seeded_net() -> BiSeNet:
    """One seeded BiSeNet for the module (filling 13 M parameters takes seconds on CPU)."""
    return fill_seeded_(BiSeNet(), 0).eval()


def _small_input() -> torch.Tensor:
    rng = np.random.default_rng(3)
    return normalize_rgb(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))


def test_bisenet_strict_load_without_num_batches_tracked(tmp_path, seeded_net):
    src = seeded_net
    sd = {k: v for k, v in src.state_dict().items() if not k.endswith("num_batches_tracked")}
    assert len(sd) == 160
    p = tmp_path / "79999_iter.pth"
    torch.save(sd, p)
    net = load_bisenet(p)
    assert not net.training
    for k, v in src.state_dict().items():
        assert torch.equal(net.state_dict()[k], v), k
    x = _small_input()
    with torch.no_grad():
        for a, b in zip(net(x), src(x)):
            assert torch.equal(a, b)
    # still strict: a missing weight or an unknown key is refused
    bad = dict(sd)
    bad.pop("ffm.conv1.weight")
    with pytest.raises(RuntimeError):
        load_bisenet_state_dict(BiSeNet(), bad)
    with pytest.raises(RuntimeError):
        load_bisenet_state_dict(BiSeNet(), {**sd, "sp.conv1.conv.weight": torch.zeros(1)})
    # DataParallel-style prefixes are accepted
    load_bisenet_state_dict(BiSeNet(), {f"module.{k}": v for k, v in sd.items()})


def test_bisenet_outputs_and_batch(seeded_net):
    net = seeded_net
    x = torch.cat([_small_input(), -_small_input()])
    with torch.no_grad():
        maps = net(x)
        single = net(x[1:])
    assert [tuple(m.shape) for m in maps] == [(2, 19, 64, 64)] * 3
    torch.testing.assert_close(maps[0][1:], single[0], rtol=1e-4, atol=1e-4)


def test_face_parser_batch_equals_single(seeded_net):
    parser = face_parsing.FaceParser(seeded_net, 90, 90)
    rng = np.random.default_rng(1)
    ims = [rng.integers(0, 256, (40, 40, 3), dtype=np.uint8) for _ in range(2)]
    both = parser.parse(ims)
    assert both.shape == (2, 512, 512)
    flipped = both[1] != parser.parse(ims[1])
    if flipped.any():  # conv rounding differs between batch sizes: only pixels whose two best classes tie may flip
        with torch.no_grad():
            logits = seeded_net(face_parsing.normalize_rgb(face_parsing.resize_for_parsing(ims[1])))[0][0]
        best, second = logits.topk(2, dim=0).values
        assert flipped.sum() <= 8 and (best - second)[torch.from_numpy(flipped)].max() < 1e-4
    m = parser.mask(both[0], "jaw")
    assert m.shape == (512, 512) and set(np.unique(m)) <= {0, 255}
    seg = parser.face_seg(ims[0], "raw")
    assert np.array_equal(seg, face_parsing.resize_mask(parser.mask(both[0], "raw"), 40, 40))


def test_parsing_modes():
    p = np.zeros((512, 512), np.uint8)
    p[200:300, 150:360] = face_parsing.SKIN
    p[240:260, 240:270] = face_parsing.NOSE
    p[300:320, 220:290] = face_parsing.U_LIP
    p[330:350, 200:300] = face_parsing.NECK
    raw = face_parsing.parsing_to_mask(p, "raw")
    neck = face_parsing.parsing_to_mask(p, "neck")
    jaw = face_parsing.parsing_to_mask(p, "jaw", 90, 90)
    assert raw[220, 250] == 255 and raw[250, 250] == 0 and raw[340, 250] == 0 and neck[340, 250] == 255
    assert jaw[250, 250] == 0  # nose removed
    assert jaw[310, 250] == 255  # lips kept
    assert jaw[305, 200] == 255  # skin dilated downwards in the centre band
    assert jaw[180, 250] == 0  # the cone kernel does not grow upwards
    k = face_parsing.cone_kernel()
    assert k.shape == (33, 33) and k[10].sum() == 1 and k[20].sum() == 21 and k[32].sum() == 21 and k[:10].sum() == 0
    with pytest.raises(ValueError):
        face_parsing.parsing_to_mask(p, "ears")


# ------------------------------------------------------------------------------ crop / frame mapping rules

def test_crop_box_rules():
    lm = synthetic_landmarks(150, 120, 50)
    det = np.array([[90, 50, 210, 190]])
    (box,), (src,) = crop.face_boxes(lm[None], det, [True])
    t = lm.astype(np.int32)
    assert src == crop.BoxSource.LANDMARK
    assert tuple(box) == (t[:, 0].min(), 2 * t[29, 1] - t[:, 1].max(), t[:, 0].max(), t[:, 1].max())
    # no detection -> placeholder whatever the landmarks say; margin leaves it alone
    (box,), (src,) = crop.face_boxes(lm[None], det, [False])
    assert src == crop.BoxSource.NONE and not box.any()
    assert not crop.add_margin(box[None], [src], 10, 300).any()
    # landmarks left of the frame -> detector box; negative coordinates truncate toward zero
    shifted = lm - np.array([lm[:, 0].min() + 0.5, 0], dtype=np.float32)
    assert crop.truncate_landmarks(shifted)[:, 0].min() == 0  # -0.5 -> 0, not -1
    shifted = lm - np.array([lm[:, 0].min() + 1.5, 0], dtype=np.float32)
    (box,), (src,) = crop.face_boxes(shifted[None], det, [True])
    assert src == crop.BoxSource.DETECTOR and tuple(box) == tuple(det[0])
    # v1.0 shift moves the top edge down by 2*shift; a shift below the chin degenerates
    (b0,), _ = crop.face_boxes(lm[None], det, [True], 0)
    (b7,), _ = crop.face_boxes(lm[None], det, [True], 7)
    assert b7[1] - b0[1] == 14 and b7[3] == b0[3]
    # v1.5 margin clamps at the frame height
    bx, _ = crop.crop_boxes(lm[None], det, [True], frame_height=int(b0[3]) + 4, version="v15", bbox_shift=99)
    assert bx[0, 3] == b0[3] + 4 and bx[0, 1] == b0[1]  # v1.5 ignores bbox_shift


@pytest.mark.parametrize("n_avatar,n_out,bs", [(1, 5, 2), (7, 23, 4), (3, 12, 12), (5, 40, 7)])
def test_frame_mapping_every_frame(n_avatar, n_out, bs):
    cycle = frame_mapping.ping_pong_cycle(n_avatar)
    pos, src = frame_mapping.output_source_frames(n_out, n_avatar)
    assert len(pos) == n_out  # every generated frame is used (no dropped last frame)
    assert len(cycle) == 2 * n_avatar and cycle[n_avatar - 1] == cycle[n_avatar] == n_avatar - 1
    assert all(src[i] == cycle[i % (2 * n_avatar)] for i in range(n_out))
    sizes = frame_mapping.batch_sizes(n_out, bs)
    assert sum(sizes) == n_out and all(s == bs for s in sizes[:-1]) and 0 < sizes[-1] <= bs
    with pytest.raises(ValueError):
        frame_mapping.ping_pong_cycle(0)
