"""Offline face landmarks: MediaPipe backend, iBUG-68 table, sequences, mouth metrics."""
from __future__ import annotations

import numpy as np
import pytest

av = pytest.importorskip("av")
cv2 = pytest.importorskip("cv2")
pytest.importorskip("mediapipe")
from skimage import data  # noqa: E402

from newsstudio.avatar import landmarks as L  # noqa: E402
from newsstudio.avatar.landmarks_68 import (  # noqa: E402
    _MIRROR_PAIRS, IBUG_MIRROR, JAW_CHAIN_RIGHT, LM68_FROM_MESH, MIRROR, lm68_weights,
    mesh_to_lm68,
)
from newsstudio.avatar.face_metrics import face_height, mouth_opening, mouth_opening_mesh, mouth_width  # noqa: E402
from newsstudio.avatar.mediapipe_mesh import MediaPipeFaceMesh  # noqa: E402
from newsstudio.avatar.one_euro import OneEuroFilter  # noqa: E402
from conftest import media_path  # noqa: E402


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def backend():
    be = L.get_backend("mediapipe")
    yield be
    be.close()


@pytest.fixture(scope="module")
def astronaut():
    return data.astronaut()


@pytest.fixture(scope="module")
def portrait():
    img = cv2.imread(str(media_path("portrait.png")), cv2.IMREAD_COLOR)
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


@pytest.fixture(scope="module")
def yongen30():
    with av.open(str(media_path("yongen.mp4"))) as c:
        frames = [f.to_ndarray(format="rgb24") for _, f in zip(range(30), c.decode(video=0))]
    assert len(frames) == 30
    return frames


def _iod(lm68: np.ndarray) -> float:
    return float(np.linalg.norm(lm68[42:48].mean(0) - lm68[36:42].mean(0)))


def _mask(shape, pts) -> np.ndarray:
    m = np.zeros(shape[:2], np.uint8)
    cv2.fillPoly(m, [np.round(pts).astype(np.int32)], 1)
    return m.astype(bool)


# ----------------------------------------------------------------------------- the table


def test_table_complete_symmetric_and_normalised():
    w = lm68_weights(478)
    assert w.shape == (68, 478)
    np.testing.assert_allclose(w.sum(1), 1.0, atol=1e-6)
    assert (w[:, 468:] == 0).all()  # iris vertices are never needed
    for i, entry in enumerate(LM68_FROM_MESH):
        j = IBUG_MIRROR[i]
        assert IBUG_MIRROR[j] == i
        mirrored = {MIRROR.get(v, v): wt for v, wt in entry}
        assert mirrored == dict(LM68_FROM_MESH[j]), (i, j)
    # the jaw runs from the temple over the chin vertex to the other temple
    assert LM68_FROM_MESH[8] == ((152, 1.0),)
    with pytest.raises(ValueError):
        mesh_to_lm68(np.zeros((100, 2)))


def test_mirror_pairs_are_mirror_images_on_a_frontal_face(backend, astronaut):
    r = backend.detect(astronaut)
    le, re = r.lm68[36:42].mean(0), r.lm68[42:48].mean(0)
    iod = np.linalg.norm(re - le)
    d = (re - le) / iod
    rot = np.array([[d[0], d[1]], [-d[1], d[0]]])
    q = (r.mesh - (le + re) / 2) @ rot.T / iod  # eye line horizontal, unit inter-ocular
    mid = q[[168, 6, 197, 4, 2, 0, 17, 152], 0].mean()
    for a, b in _MIRROR_PAIRS:
        assert abs((q[a, 0] - mid) + (q[b, 0] - mid)) < 0.05, (a, b)
        assert abs(q[a, 1] - q[b, 1]) < 0.05, (a, b)


def _jaw_arc_positions(mesh: np.ndarray, chain, corner: int) -> np.ndarray:
    """Fractional chain positions of jaw points 0..8: eye-corner height, then equal arc."""
    p = mesh[:, :2].astype(np.float64)
    le, re = (p[33] + p[133]) / 2, (p[263] + p[362]) / 2
    ang = np.arctan2(*(re - le)[::-1])
    rot = np.array([[np.cos(ang), np.sin(ang)], [-np.sin(ang), np.cos(ang)]])
    q = (p - le) @ rot.T
    pts = q[list(chain)]
    seg = np.linalg.norm(np.diff(pts, axis=0), axis=1)
    cum = np.r_[0.0, np.cumsum(seg)]
    ys = pts[:, 1]
    j = int(np.nonzero(ys >= q[corner, 1])[0][0])
    s0 = cum[j - 1] + (q[corner, 1] - ys[j - 1]) / (ys[j] - ys[j - 1]) * seg[j - 1]
    return np.interp(s0 + (cum[-1] - s0) * np.arange(9) / 8, cum, np.arange(len(chain)))


def _table_positions(chain) -> np.ndarray:
    pos = {v: k for k, v in enumerate(chain)}
    return np.array([sum(pos[v] * wt for v, wt in LM68_FROM_MESH[i]) for i in range(9)])


@pytest.mark.parametrize("which", ["astronaut", "portrait"])
def test_jaw_table_matches_arc_length_derivation(backend, which, request):
    mesh = backend.detect(request.getfixturevalue(which)).mesh
    table = _table_positions(JAW_CHAIN_RIGHT)
    chain_left = [MIRROR.get(v, v) for v in JAW_CHAIN_RIGHT]
    for chain, corner in ((JAW_CHAIN_RIGHT, 33), (chain_left, 263)):
        derived = _jaw_arc_positions(mesh, chain, corner)
        assert np.abs(derived - table).max() < 0.5, (derived, table)


# ----------------------------------------------------------------------------- photos


@pytest.mark.parametrize("which", ["astronaut", "portrait"])
def test_one_face_with_plausible_geometry(backend, which, request):
    img = request.getfixturevalue(which)
    h, w = img.shape[:2]
    r = backend.detect(img)
    assert r is not None and r.backend == "mediapipe"
    assert r.mesh.shape == (478, 2) and r.mesh.dtype == np.float32
    assert r.lm68.shape == (68, 2) and r.lm68.dtype == np.float32
    assert 0.5 < r.score <= 1.0
    x1, y1, x2, y2 = r.box
    assert 0 <= x1 < x2 <= w and 0 <= y1 < y2 <= h
    assert (x2 - x1) > 0.1 * w
    p = r.lm68
    assert np.all((p[:, 0] >= x1 - 1) & (p[:, 0] <= x2 + 1))
    assert np.all((p[:, 1] >= y1 - 1) & (p[:, 1] <= y2 + 1))
    brows, eyes, nose_tip = p[17:27, 1].mean(), p[36:48, 1].mean(), p[30, 1]
    mouth, chin = p[48:68, 1].mean(), p[8, 1]
    assert brows < eyes < nose_tip < mouth < chin
    assert p[36:42, 0].mean() < p[27:36, 0].mean() < p[42:48, 0].mean()  # image-left eye first
    iod = _iod(p)
    assert 0.35 < iod / (x2 - x1) < 0.6
    # MuseTalk's crop takes the max y of all 68 points as the chin: it must be point 8 ...
    assert int(np.argmax(p[:, 1])) == 8
    # ... and the jaw must wrap the lower face: temples near eye height, wider than the eyes
    assert abs(p[0, 1] - p[36, 1]) < 0.25 * iod and abs(p[16, 1] - p[45, 1]) < 0.25 * iod
    assert p[0, 0] < p[36, 0] and p[16, 0] > p[45, 0]
    assert p[4, 0] < p[48, 0] and p[12, 0] > p[54, 0]
    assert np.all(np.diff(p[0:9, 1]) > 0) and np.all(np.diff(p[8:17, 1]) < 0)
    # contours run in iBUG order: left to right along brows, lips, nostrils
    for seq in ((17, 18, 19, 20, 21), (22, 23, 24, 25, 26), (31, 32, 33, 34, 35),
                (48, 49, 50, 51, 52, 53, 54), (59, 58, 57, 56, 55), (60, 61, 62, 63, 64),
                (67, 66, 65), (36, 37, 38, 39), (42, 43, 44, 45)):
        assert np.all(np.diff(p[list(seq), 0]) > 0), seq
    assert p[50, 1] < p[51, 1] and p[52, 1] < p[51, 1]  # cupid's bow dips at the midline
    # inner lips lie between the outer ones (a closed mouth may cross 62/66 by a pixel)
    assert p[51, 1] < min(p[62, 1], p[66, 1]) and max(p[62, 1], p[66, 1]) < p[57, 1]
    # eyes on the eyes: pupils/lashes make the eye polygons much darker than the skin
    lum = img.astype(np.float32).mean(-1)
    skin = _mask(img.shape, p[[39, 42, 35, 31]])
    eyes_m = _mask(img.shape, p[36:42]) | _mask(img.shape, p[42:48])
    assert lum[eyes_m].mean() < 0.8 * lum[skin].mean()


def test_lips_are_on_the_lips(backend, portrait, yongen30):
    for img in (portrait, yongen30[0]):
        p = backend.detect(img).lm68
        f = img.astype(np.float32)
        redness = f[..., 0] / (f.sum(-1) + 1.0)
        ring = _mask(img.shape, p[48:60]) & ~_mask(img.shape, p[60:68])
        skin = _mask(img.shape, p[[39, 42, 35, 31]])
        assert redness[ring].mean() > redness[skin].mean() + 0.03


def test_small_face_found_through_full_range_fallback(portrait):
    canvas = np.full((1920, 1080, 3), 90, np.uint8)
    canvas[500:750, 300:550] = cv2.resize(portrait, (250, 250), interpolation=cv2.INTER_AREA)
    with MediaPipeFaceMesh(small_face_fallback=False) as plain:
        assert plain.detect(canvas) is None  # too small for the short-range detector alone
    with MediaPipeFaceMesh() as be:
        r = be.detect(canvas)
        assert r is not None
        x1, y1, x2, y2 = r.box
        assert 300 <= x1 < x2 <= 550 and 500 <= y1 < y2 <= 750
        # tracking a slowly moving small face stays in crop mode and keeps it
        frames = [np.roll(canvas, 3 * k, axis=1) for k in range(6)]
        tracked = be.track(frames, smooth=False)
    assert all(t is not None for t in tracked)
    dx = [t.lm68[30, 0] - tracked[0].lm68[30, 0] for t in tracked]
    np.testing.assert_allclose(dx, 3.0 * np.arange(6), atol=1.5)


def test_native_log_noise_is_suppressed(astronaut, capfd):
    capfd.readouterr()
    with MediaPipeFaceMesh() as be:  # a fresh graph loads its models: MediaPipe logs then
        assert be.detect(astronaut) is not None
        assert be.track([astronaut, astronaut])[1] is not None
    out = capfd.readouterr()
    assert out.err == "" and out.out == ""


def test_input_validation(backend, astronaut):
    gray = astronaut.mean(-1).astype(np.uint8)
    assert backend.detect(gray) is not None
    rgba = np.dstack([astronaut, np.full(astronaut.shape[:2], 255, np.uint8)])
    assert backend.detect(rgba) is not None
    assert backend.detect(astronaut.astype(np.float32) / 255.0) is not None
    with pytest.raises(ValueError, match="RGB"):
        backend.detect(np.zeros((4, 64, 64, 3), np.uint8))


# ----------------------------------------------------------------------------- video


def test_yongen_tracks_with_small_jitter(backend, yongen30):
    raw = backend.track(yongen30, smooth=False)
    smooth = backend.track(yongen30)
    assert all(r is not None for r in raw) and all(s is not None for s in smooth)
    R = np.stack([r.mesh for r in raw])
    S = np.stack([s.mesh for s in smooth])
    iod = np.mean([_iod(r.lm68) for r in raw])
    rigid = [33, 133, 263, 362, 168, 6, 197, 195, 5, 4, 1, 127, 356, 152]

    def jitter(m):  # mean |second difference|: what the eye sees as shimmer
        return np.abs(m[2:, rigid] - 2 * m[1:-1, rigid] + m[:-2, rigid]).mean() / iod

    assert jitter(R) < 0.01
    assert jitter(S) < 0.7 * jitter(R)
    step = np.abs(np.diff(S[:, rigid], axis=0)).max(axis=(1, 2)) / iod
    assert step.max() < 0.05  # no frame jumps
    # tracking agrees with per-frame static detection (no drift)
    for i in (0, 15, 29):
        ref = backend.detect(yongen30[i]).lm68
        assert np.linalg.norm(smooth[i].lm68 - ref, axis=1).mean() < 0.05 * iod


def test_one_euro_filter_smooths_still_points_and_follows_motion():
    rng = np.random.default_rng(0)
    t = np.arange(250) * 0.04
    x = np.zeros((250, 2, 2))
    x[:, 1, 1] = 0.03 * np.sin(2 * np.pi * 4.0 * t)  # 4 Hz lip motion, 0.03 face heights
    x += rng.normal(0, 0.002, x.shape)  # landmark noise
    f = OneEuroFilter()
    y = np.stack([f(xi, 0.04, 1.0) for xi in x])[20:]
    assert y[:, 0].std() < 0.7 * x[20:, 0].std()
    assert np.sqrt(2) * y[:, 1, 1].std() / 0.03 > 0.85
    f.reset()
    np.testing.assert_allclose(f(x[0], 0.04), x[0], atol=1e-6)  # starts fresh after a cut


# ----------------------------------------------------------------------------- no face


def test_no_face_gives_none(backend):
    rng = np.random.default_rng(1)
    assert backend.detect(np.zeros((480, 640, 3), np.uint8)) is None
    assert backend.detect(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)) is None


@pytest.fixture(scope="module")
def gappy(astronaut):
    rng = np.random.default_rng(2)
    blank = np.zeros_like(astronaut)
    noise = rng.integers(0, 256, astronaut.shape, dtype=np.uint8)
    return [blank] * 4 + [astronaut] * 13 + [noise] + [astronaut] * 2  # 20 frames


def test_detect_sequence_error_names_frames(backend, gappy):
    with pytest.raises(L.NoFaceError, match=r"no face found in frames 0-3, 17 of 20") as ei:
        L.detect_sequence(gappy, "error", backend)
    assert isinstance(ei.value, ValueError)
    assert ei.value.missing == [0, 1, 2, 3, 17] and ei.value.total == 20
    with pytest.raises(L.NoFaceError, match="any of the 3 frames"):
        L.detect_sequence([np.zeros((256, 256, 3), np.uint8)] * 3, "nearest", backend)
    with pytest.raises(ValueError, match="policy"):
        L.detect_sequence(gappy, "skip", backend)


def test_detect_sequence_nearest_fills_gaps(backend, gappy):
    res = L.detect_sequence(gappy, "nearest", backend, smooth=False)
    assert len(res) == 20 and all(r is not None for r in res)
    for i in range(4):
        np.testing.assert_array_equal(res[i].lm68, res[4].lm68)
    np.testing.assert_array_equal(res[17].lm68, res[16].lm68)  # tie 16/18 -> the earlier
    assert res[0] is not res[4]  # copies, not aliases


def test_registry_and_detect_only_backends(backend, astronaut, monkeypatch):
    assert isinstance(backend, L.LandmarkBackend) and backend.name == "mediapipe"
    assert L.available_backends()["mediapipe"] is None
    with pytest.raises(ValueError, match="unknown landmark backend"):
        L.get_backend("nope")

    class DetectOnly:  # a backend without track(): detect_sequence goes frame by frame
        name = "detect-only"

        def __init__(self):
            self.inner = MediaPipeFaceMesh()
            self.calls = 0

        def detect(self, rgb):
            self.calls += 1
            return self.inner.detect(rgb)

        def close(self):
            self.inner.close()

    monkeypatch.setattr(L, "_BACKENDS", dict(L._BACKENDS))
    L.register_backend("official", DetectOnly, available=lambda: "weights not found", priority=10)
    with pytest.raises(RuntimeError, match="weights not found"):
        L.get_backend("official")
    assert L.get_backend().name == "mediapipe"  # unusable official backend is skipped
    L.register_backend("official", DetectOnly, priority=10)
    be = L.get_backend()
    assert be.name == "detect-only"
    res = L.detect_sequence([astronaut, np.zeros_like(astronaut)], "nearest", be)
    assert be.calls == 2
    np.testing.assert_array_equal(res[1].lm68, res[0].lm68)
    be.close()


def test_format_frame_ranges():
    assert L.format_frame_ranges([17, 0, 1, 2, 3]) == "0-3, 17"
    assert L.format_frame_ranges([5]) == "5"
    assert L.format_frame_ranges([1, 3, 4, 9, 10, 11]) == "1, 3-4, 9-11"


# ----------------------------------------------------------------------------- metrics


def _hand_lm68(gap: float, scale: float = 1.0, width: float = 60.0) -> np.ndarray:
    p = np.zeros((68, 2))
    p[:, 0] = 100.0
    p[[19, 24], 1] = 0.0
    p[8, 1] = 200.0
    for up, lo, x in ((61, 67, 90.0), (62, 66, 100.0), (63, 65, 110.0)):
        p[up] = (x, 150.0)
        p[lo] = (x, 150.0 + gap)
    p[48] = (100 - width / 2, 150.0)
    p[54] = (100 + width / 2, 150.0)
    return p * scale


def test_mouth_metrics_on_hand_made_points():
    assert mouth_opening(_hand_lm68(0.0)) == 0.0
    assert mouth_opening(_hand_lm68(20.0)) == pytest.approx(0.1)
    assert mouth_opening(_hand_lm68(20.0, scale=3.7)) == pytest.approx(0.1)  # scale free
    assert face_height(_hand_lm68(0.0)) == pytest.approx(200.0)
    assert mouth_width(_hand_lm68(0.0, width=80.0)) == pytest.approx(0.4)
    batch = np.stack([_hand_lm68(g) for g in (0.0, 10.0, 30.0)])
    np.testing.assert_allclose(mouth_opening(batch), [0.0, 0.05, 0.15])
    with pytest.raises(ValueError, match="degenerate"):
        mouth_opening(np.zeros((68, 2)))
    with pytest.raises(ValueError):
        mouth_opening(np.zeros((20, 2)))


def test_mouth_opening_grows_when_the_mouth_is_painted_open(backend, portrait):
    img0 = cv2.resize(portrait, (716, 716), interpolation=cv2.INTER_AREA)
    r0 = backend.detect(img0)
    p = r0.lm68
    fh = face_height(p)
    ym = int(round(p[[62, 66], 1].mean()))
    xl, xr = p[60, 0], p[64, 0]
    openings = [(mouth_opening(p), mouth_opening_mesh(r0.mesh))]
    for frac in (0.04, 0.08, 0.12):
        k = int(round(frac * fh))
        # push the lower face down by k rows at the lip line and paint a dark mouth cavity
        img = np.concatenate([img0[:ym], np.repeat(img0[ym - 1:ym], k, 0), img0[ym:]], 0)
        img = np.ascontiguousarray(img[:img0.shape[0]])
        cv2.ellipse(img, (int((xl + xr) / 2), ym + k // 2), (int((xr - xl) / 2), max(k // 2, 1)),
                    0, 0, 360, (60, 20, 25), -1, cv2.LINE_AA)
        r = backend.detect(img)
        assert r is not None
        openings.append((mouth_opening(r.lm68), mouth_opening_mesh(r.mesh)))
    o68, omesh = np.array(openings).T
    assert o68[0] < 0.01 and omesh[0] < 0.01  # the portrait's mouth is closed
    assert np.all(np.diff(o68) > 0.005) and np.all(np.diff(omesh) > 0.005)
    assert o68[-1] > 0.05
    np.testing.assert_allclose(o68, omesh, atol=0.01)  # both measures share one scale


def test_open_smile_measures_more_open_than_closed_mouth(backend, astronaut, portrait):
    smile = backend.detect(astronaut)  # teeth showing
    closed = backend.detect(portrait)
    assert mouth_opening(smile.lm68) > 0.04 > 0.01 > mouth_opening(closed.lm68)
    assert mouth_opening_mesh(smile.mesh) > 0.04 > 0.01 > mouth_opening_mesh(closed.mesh)
    assert 0.3 < mouth_width(smile.lm68) < 0.7 and 0.3 < mouth_width(closed.lm68) < 0.7
