"""MediaPipe face-mesh (468/478 vertices) -> iBUG-68 landmark table.

Why a table: the engines (MuseTalk's crop, the classic warp, the lip-sync metrics) speak
iBUG-68, while the offline detector we can ship gives the dense MediaPipe mesh. Each of the
68 points is a fixed weighted average of one or two mesh vertices, so ``lm68 = W @ mesh``
is one small matrix product and follows the mesh exactly (no per-frame search).

How it was derived (and is re-checked by ``tests/test_landmarks.py``):

* jaw 0-16: the mesh's face-oval chain from the temple down to the chin (vertex 152, the
  lowest point of the face, which MuseTalk's crop uses as its bottom edge). Point 0/16 sits
  at the height of the outer eye corner, and 0..8 are equally spaced by arc length down to
  the chin, as in the iBUG annotation protocol. The fractional chain positions were measured
  on three frontal faces (astronaut, the painted portrait, the presenter video) and
  averaged; the test re-derives them and checks the table is within half a vertex.
* brows: upper brow contour (iBUG annotates the upper border), outer -> inner.
* nose: bridge from the nasion (168) to the tip, 28/29 at thirds of the bridge, bottom of
  the nose through the subnasale (2).
* eyes: corners and the upper/lower lid vertices at one third / two thirds of each lid.
* lips: corners, cupid's-bow peaks, midline; inner lips at the corners, halfway and midline.

Only the subject's right half (image left) is written out; the left half is its mirror
through ``MIRROR``, so the table is symmetric by construction.
"""
from __future__ import annotations

import numpy as np

# Face-oval chain from the subject's right temple (image left) down to the chin (152).
JAW_CHAIN_RIGHT: tuple[int, ...] = (54, 21, 162, 127, 234, 93, 132, 58, 172, 136, 150, 149,
                                    176, 148, 152)

# Left/right mirror pairs of the MediaPipe canonical mesh for every vertex the table uses
# (vertices on the midline map to themselves and are not listed).
_MIRROR_PAIRS: tuple[tuple[int, int], ...] = (
    # face oval
    (54, 284), (21, 251), (162, 389), (127, 356), (234, 454), (93, 323), (132, 361),
    (58, 288), (172, 397), (136, 365), (150, 379), (149, 378), (176, 400), (148, 377),
    # brows (upper contour)
    (70, 300), (63, 293), (105, 334), (66, 296), (107, 336),
    # nose bottom
    (98, 327), (97, 326),
    # eyes
    (33, 263), (160, 387), (158, 385), (133, 362), (153, 380), (144, 373),
    # outer lips
    (61, 291), (40, 270), (37, 267), (91, 321), (84, 314), (181, 405), (146, 375),
    # inner lips
    (78, 308), (80, 310), (81, 311), (82, 312), (88, 318), (178, 402), (87, 317), (95, 324),
)
MIRROR: dict[int, int] = {}
for _a, _b in _MIRROR_PAIRS:
    MIRROR[_a] = _b
    MIRROR[_b] = _a

Entry = tuple[tuple[int, float], ...]

# Subject's right half + midline: iBUG index -> ((mesh vertex, weight), ...).
_RIGHT_HALF: dict[int, Entry] = {
    # jaw 0..8 (temple -> chin), weights from the arc-length derivation described above
    0: ((127, 0.85), (234, 0.15)),
    1: ((234, 0.5), (93, 0.5)),
    2: ((93, 0.3), (132, 0.7)),
    3: ((132, 0.2), (58, 0.8)),
    4: ((172, 1.0),),
    5: ((136, 0.6), (150, 0.4)),
    6: ((150, 0.1), (149, 0.9)),
    7: ((176, 0.45), (148, 0.55)),
    8: ((152, 1.0),),
    # right brow 17..21, outer -> inner
    17: ((70, 1.0),),
    18: ((63, 1.0),),
    19: ((105, 1.0),),
    20: ((66, 1.0),),
    21: ((107, 1.0),),
    # nose bridge 27..30 (midline), nose bottom 31..33
    27: ((168, 1.0),),
    28: ((197, 1.0),),
    29: ((5, 1.0),),
    30: ((4, 1.0),),
    31: ((98, 1.0),),
    32: ((97, 1.0),),
    33: ((2, 1.0),),
    # right eye 36..41: outer corner, upper lid (outer, inner third), inner corner, lower lid
    36: ((33, 1.0),),
    37: ((160, 1.0),),
    38: ((158, 1.0),),
    39: ((133, 1.0),),
    40: ((153, 1.0),),
    41: ((144, 1.0),),
    # outer lips: right corner, upper lip, top midline; lower midline, lower lip
    48: ((61, 1.0),),
    49: ((40, 1.0),),
    50: ((37, 1.0),),
    51: ((0, 1.0),),
    57: ((17, 1.0),),
    58: ((84, 1.0),),
    59: ((91, 1.0),),
    # inner lips: right corner, upper halfway, upper midline; lower midline, lower halfway
    60: ((78, 1.0),),
    61: ((80, 0.5), (81, 0.5)),
    62: ((13, 1.0),),
    66: ((14, 1.0),),
    67: ((88, 0.5), (178, 0.5)),
}

# iBUG mirror partner of each index (the 68-point scheme's own left/right symmetry).
IBUG_MIRROR: dict[int, int] = {}
for _i in range(17):
    IBUG_MIRROR[_i] = 16 - _i
for _i in range(17, 27):
    IBUG_MIRROR[_i] = 43 - _i
for _i in range(27, 31):
    IBUG_MIRROR[_i] = _i
for _i in range(31, 36):
    IBUG_MIRROR[_i] = 66 - _i
for _a, _b in ((36, 45), (37, 44), (38, 43), (39, 42), (40, 47), (41, 46)):
    IBUG_MIRROR[_a], IBUG_MIRROR[_b] = _b, _a
for _i in range(48, 55):
    IBUG_MIRROR[_i] = 102 - _i
for _i in range(55, 60):
    IBUG_MIRROR[_i] = 114 - _i
for _i in range(60, 65):
    IBUG_MIRROR[_i] = 124 - _i
for _i in range(65, 68):
    IBUG_MIRROR[_i] = 132 - _i


def _build_table() -> tuple[Entry, ...]:
    table: dict[int, Entry] = dict(_RIGHT_HALF)
    for i, entry in _RIGHT_HALF.items():
        j = IBUG_MIRROR[i]
        mirrored = tuple((MIRROR.get(v, v), w) for v, w in entry)
        if j == i:
            if mirrored != entry:  # a midline point must be built from midline vertices
                raise AssertionError(f"iBUG point {i} is on the midline but its entry is not")
            continue
        table[j] = mirrored
    if sorted(table) != list(range(68)):
        raise AssertionError(f"68-point table is incomplete: {sorted(set(range(68)) - set(table))}")
    for i, entry in table.items():
        if abs(sum(w for _, w in entry) - 1.0) > 1e-6:
            raise AssertionError(f"weights of iBUG point {i} do not sum to 1")
    return tuple(table[i] for i in range(68))


LM68_FROM_MESH: tuple[Entry, ...] = _build_table()

# Inner-lip vertex pairs (upper, lower) of the dense mesh, from the midline outwards: the
# finer mouth-opening measure uses all of them.
MESH_INNER_LIP_PAIRS: tuple[tuple[int, int], ...] = (
    (13, 14), (82, 87), (312, 317), (81, 178), (311, 402), (80, 88), (310, 318),
)
MESH_BROW_MID = (105, 334)  # same vertices as iBUG 19 / 24
MESH_CHIN = 152  # same vertex as iBUG 8


def lm68_weights(num_vertices: int = 468) -> np.ndarray:
    """(68, num_vertices) float32 matrix W such that ``lm68 = W @ mesh``."""
    if num_vertices < 468:
        raise ValueError(f"the 68-point table needs the 468-vertex mesh, got {num_vertices}")
    w = np.zeros((68, num_vertices), np.float32)
    for i, entry in enumerate(LM68_FROM_MESH):
        for v, wt in entry:
            w[i, v] += wt
    return w


_W_CACHE: dict[int, np.ndarray] = {}


def mesh_to_lm68(mesh: np.ndarray) -> np.ndarray:
    """Map a (N>=468, 2 or 3) mesh to (68, same) iBUG-68 points, float32."""
    mesh = np.asarray(mesh, np.float32)
    if mesh.ndim != 2 or mesh.shape[0] < 468:
        raise ValueError(f"expected a (468+, D) mesh, got shape {mesh.shape}")
    w = _W_CACHE.get(mesh.shape[0])
    if w is None:
        w = _W_CACHE[mesh.shape[0]] = lm68_weights(mesh.shape[0])
    return w @ mesh
