"""Landmark-driven mouth warp: mouth parameters -> displaced landmarks -> dense warp of the ROI.

Why a thin-plate spline: it interpolates the landmark displacements exactly with the least
bending, so lips move where we say and the skin around them stretches smoothly; anchors on
the nose, the upper jaw and the ROI border keep everything else still. The spline is solved
per frame (a ~90x90 system), evaluated on a coarse grid and upsampled (the field is smooth),
then applied backwards with grid_sample. The mouth opening is set absolutely (the target
inner-lip gap), so a source frame whose mouth is open is closed first: silence gives a closed
mouth whatever the source loop does. New mouth interior is painted dark with a hint of upper
teeth so an open mouth reads as open.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# iBUG-68 index groups
UPPER_INNER = (61, 62, 63)
LOWER_INNER = (67, 66, 65)
LOWER_OUTER = (59, 58, 57, 56, 55)
UPPER_OUTER = (49, 50, 51, 52, 53)
CORNERS = (48, 54, 60, 64)
JAW_WEIGHTS = {3: 0.15, 4: 0.35, 5: 0.6, 6: 0.8, 7: 0.92, 8: 1.0, 9: 0.92, 10: 0.8, 11: 0.6, 12: 0.35, 13: 0.15}
ANCHORS = tuple(range(17, 48)) + (0, 1, 2, 14, 15, 16)
MAX_GAP = 0.11  # inner-lip gap at full opening, as a fraction of face height
CORNER_SPREAD = 0.045  # corner motion at full spread, fraction of face width
REST_GAP = 0.03  # an inner-lip gap below this fraction of face height counts as a closed mouth
CLOSE_OVERLAP = 0.012  # closed lips overlap by this fraction of face height
UPPER_SHARE_CLOSING = 0.4  # share of a closing done by the upper lip
COARSE = 4  # the displacement field is evaluated every COARSE pixels


def _tps_kernel(r2: torch.Tensor) -> torch.Tensor:
    return r2 * torch.log(r2.clamp_min(1e-9))


def target_landmarks(lm: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Displaced landmarks (B, 68, 2) for mouth params (B, 3) = (opening, spread, level)."""
    opening = params[:, 0].clamp(0, 1)
    spread = params[:, 1].clamp(-1, 1)
    brow = lm[:, 17:27].mean(1)
    fh = (lm[:, 8] - brow).norm(dim=-1)
    fw = (lm[:, 16] - lm[:, 0]).norm(dim=-1)
    up = list(UPPER_INNER)
    lo = list(LOWER_INNER)
    gap_src = (lm[:, lo, 1] - lm[:, up, 1]).mean(1)
    # A source at rest (lips together or barely parted) keeps its own rest shape as "closed";
    # a source caught mid-speech is closed, the lips overlapping slightly so no sliver of
    # teeth survives.
    at_rest = gap_src < REST_GAP * fh
    closed = torch.where(at_rest, gap_src, -CLOSE_OVERLAP * fh)
    gap = closed + opening * MAX_GAP * fh
    change = gap - gap_src  # negative closes an open source mouth
    # opening moves the jaw (lower lip); closing meets in the middle, as lips do
    close = change.clamp_max(0)
    delta = change.clamp_min(0) + (1 - UPPER_SHARE_CLOSING) * close
    out = lm.clone()
    dy = torch.zeros_like(lm[..., 1])
    for i in LOWER_INNER + LOWER_OUTER:
        dy[:, i] = delta
    for i, wgt in JAW_WEIGHTS.items():
        dy[:, i] = delta * wgt
    lift = -0.12 * change.clamp_min(0) - UPPER_SHARE_CLOSING * close
    for i in UPPER_INNER + UPPER_OUTER:
        dy[:, i] = lift
    for i in CORNERS:
        dy[:, i] = 0.45 * change.clamp_min(0)
    out[..., 1] += dy
    centre_x = lm[:, [48, 54], 0].mean(1)
    dx = spread * CORNER_SPREAD * fw - 0.25 * opening * CORNER_SPREAD * fw
    for i in CORNERS:
        sign = torch.sign(lm[:, i, 0] - centre_x)
        out[:, i, 0] += sign * dx
    return out


def _border_points(h: int, w: int, n: int, device: torch.device) -> torch.Tensor:
    t = torch.linspace(0, 1, n, device=device)
    xs, ys = t * (w - 1), t * (h - 1)
    top = torch.stack([xs, torch.zeros_like(xs)], -1)
    bottom = torch.stack([xs, torch.full_like(xs, h - 1)], -1)
    left = torch.stack([torch.zeros_like(ys[1:-1]), ys[1:-1]], -1)
    right = torch.stack([torch.full_like(ys[1:-1], w - 1), ys[1:-1]], -1)
    return torch.cat([top, bottom, left, right])


def backward_field(src: torch.Tensor, dst: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """Sampling positions (B, H, W, 2) in pixels: for each output pixel, where to read the source.

    A TPS through control points placed at their *destination* with the reverse displacement
    (src - dst) approximates the inverse warp well for the small motions of a mouth."""
    h, w = hw
    b, k, _ = dst.shape
    # float64 for the spline (small matrices: cheap): in float32 the batched matrix products round
    # differently for each batch slot (memory alignment picks the kernel), so the same frame rendered
    # in another chunk position moved pixels by up to 0.15 levels; in float64 those differences vanish
    # when the field is rounded back to float32, and a still avatar stays exactly still.
    dev = dst.device
    dt = torch.float64 if dev.type != "mps" else torch.float32  # the spline's dtype
    scale = float(max(h, w))
    c = dst.to(dt) / scale
    v = (src - dst).to(dt) / scale
    r2 = (c[:, :, None, :] - c[:, None, :, :]).pow(2).sum(-1)
    kmat = _tps_kernel(r2) + 1e-6 * torch.eye(k, device=dev, dtype=dt)
    p = torch.cat([torch.ones(b, k, 1, device=dev, dtype=dt), c], -1)
    top = torch.cat([kmat, p], 2)
    bot = torch.cat([p.transpose(1, 2), torch.zeros(b, 3, 3, device=dev, dtype=dt)], 2)
    system = torch.cat([top, bot], 1)
    rhs = torch.cat([v, torch.zeros(b, 3, 2, device=dev, dtype=dt)], 1)
    coef = torch.linalg.solve(system, rhs)  # (B, K+3, 2)
    step = max(COARSE, int(max(h, w)) // 96)
    hc, wc = (h + step - 1) // step + 1, (w + step - 1) // step + 1
    gy, gx = torch.meshgrid(torch.arange(hc, device=dev, dtype=dt) * step, torch.arange(wc, device=dev, dtype=dt) * step, indexing="ij")
    q = torch.stack([gx, gy], -1).reshape(1, -1, 2) / scale
    # |q - c|^2 = |q|^2 + |c|^2 - 2 q.c as one matrix product (no (B, Nq, K, 2) temporary)
    rq = ((q * q).sum(-1, keepdim=True) + (c * c).sum(-1).unsqueeze(1) - 2 * q @ c.transpose(1, 2)).clamp_min(0)
    disp = _tps_kernel(rq) @ coef[:, :k] + coef[:, k : k + 1] + q @ coef[:, k + 1 :]
    disp = (disp.reshape(b, hc, wc, 2).permute(0, 3, 1, 2) * scale).to(torch.float32).contiguous()
    full = F.interpolate(disp, size=((hc - 1) * step + 1, (wc - 1) * step + 1), mode="bilinear", align_corners=True)[:, :, :h, :w]
    ys, xs = torch.meshgrid(torch.arange(h, device=dev, dtype=torch.float32), torch.arange(w, device=dev, dtype=torch.float32),
                            indexing="ij")
    base = torch.stack([xs, ys], 0).unsqueeze(0)
    return (base + full).permute(0, 2, 3, 1)


def _inside_polygon(poly: torch.Tensor, hw: tuple[int, int], box: tuple[int, int, int, int]) -> torch.Tensor:
    """Soft coverage of closed polygons (B, P, 2) inside `box` = (x0, y0, x1, y1): a 2x2
    supersampled crossing test evaluated only over the box (the mouth), (B, y1-y0, x1-x0)."""
    x0, y0, x1, y1 = box
    dev = poly.device
    acc = torch.zeros(poly.shape[0], y1 - y0, x1 - x0, device=dev)
    for oy in (0.25, 0.75):
        for ox in (0.25, 0.75):
            ys = torch.arange(y0, y1, device=dev, dtype=torch.float32).view(1, -1, 1, 1) + oy - 0.5
            xs = torch.arange(x0, x1, device=dev, dtype=torch.float32).view(1, 1, -1, 1) + ox - 0.5
            a = poly.view(-1, 1, 1, poly.shape[1], 2)
            bpt = torch.roll(a, -1, dims=3)
            ay, by = a[..., 1], bpt[..., 1]
            ax, bx = a[..., 0], bpt[..., 0]
            crosses = (ay > ys) != (by > ys)
            xint = ax + (ys - ay) * (bx - ax) / torch.where((by - ay).abs() < 1e-6, torch.full_like(by, 1e-6), by - ay)
            hit = crosses & (xs < xint)
            acc += (hit.sum(-1) % 2).float()
    return acc / 4


def _chaikin(poly: torch.Tensor, iterations: int = 2) -> torch.Tensor:
    """Corner-cutting subdivision of closed polygons (B, P, 2): lips are curves, not hexagons."""
    for _ in range(iterations):
        nxt = torch.roll(poly, -1, dims=1)
        q = 0.75 * poly + 0.25 * nxt
        r = 0.25 * poly + 0.75 * nxt
        poly = torch.stack([q, r], dim=2).reshape(poly.shape[0], -1, 2)
    return poly


def warp_mouth(roi: torch.Tensor, lm: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Render a batch: roi (B, H, W, 3) uint8/float, ROI-space landmarks (B, 68, 2), params (B, 3)
    -> (B, H, W, 3) float in [0, 255]."""
    b, h, w, _ = roi.shape
    dev = roi.device
    img = roi.permute(0, 3, 1, 2).float()
    dst = target_landmarks(lm.float(), params.float())
    border = _border_points(h, w, 9, dev).unsqueeze(0).expand(b, -1, -1)
    moving = [i for i in range(68) if i not in ANCHORS]
    anchors = list(ANCHORS)
    src_pts = torch.cat([lm[:, moving].float(), lm[:, anchors].float(), border], 1)
    dst_pts = torch.cat([dst[:, moving], lm[:, anchors].float(), border], 1)
    pos = backward_field(src_pts, dst_pts, (h, w))
    grid = torch.stack([(pos[..., 0] + 0.5) / w * 2 - 1, (pos[..., 1] + 0.5) / h * 2 - 1], -1)
    out = F.grid_sample(img, grid, mode="bilinear", padding_mode="border", align_corners=False)

    # Paint the interior of the new (target) inner-lip polygon.
    inner = _chaikin(dst[:, [60, 61, 62, 63, 64, 65, 66, 67]])
    lo = inner.amin(dim=(0, 1)).floor().long().tolist()
    hi = inner.amax(dim=(0, 1)).ceil().long().tolist()
    box = (max(0, lo[0] - 2), max(0, lo[1] - 2), min(w, hi[0] + 3), min(h, hi[1] + 3))
    cover = torch.zeros(b, h, w, device=dev)
    if box[2] > box[0] and box[3] > box[1]:
        cover[:, box[1] : box[3], box[0] : box[2]] = _inside_polygon(inner, (h, w), box)
    brow = lm[:, 17:27].mean(1)
    fh = (lm[:, 8] - brow).norm(dim=-1)
    gap = (dst[:, list(LOWER_INNER), 1] - dst[:, list(UPPER_INNER), 1]).mean(1)
    visible = ((gap / fh.clamp_min(1.0)) / 0.02).clamp(0, 1).view(b, 1, 1)
    y_top = dst[:, list(UPPER_INNER), 1].mean(1).view(b, 1, 1)
    y_bot = dst[:, list(LOWER_INNER), 1].mean(1).view(b, 1, 1)
    ys = torch.arange(h, device=dev, dtype=torch.float32).view(1, h, 1)
    frac = ((ys - y_top) / (y_bot - y_top).clamp_min(1.0)).clamp(0, 1)
    teeth = torch.tensor([205.0, 198.0, 188.0], device=dev).view(1, 3, 1, 1)
    cavity = torch.tensor([52.0, 22.0, 26.0], device=dev).view(1, 3, 1, 1)
    t = (1 - (frac / 0.28)).clamp(0, 1).unsqueeze(1) * (gap / fh.clamp_min(1.0) > 0.035).float().view(b, 1, 1, 1)
    fill = cavity + t * (teeth - cavity)
    alpha = (cover * visible).unsqueeze(1)
    out = out + alpha * (fill - out)
    return out.permute(0, 2, 3, 1).clamp(0, 255)
