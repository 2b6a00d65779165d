"""The weight-free `classic` engine: audio envelope/spectrum -> mouth shape -> landmark warp.

Works on any machine (CPU included) with nothing to download, which makes it the default
when no neural weights are found. It renders in the packet's generic lower-face ROI.
"""
from __future__ import annotations

import torch

from ...avatar.packet import Packet
from ..base import AvatarLayer, Engine, FrameQueue
from .mouth import MouthConditioner, N_PARAMS
from .warp import warp_mouth


class ClassicEngine(Engine):
    name = "classic"
    sample_rate = 16000

    def __init__(self, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, **_: object):
        super().__init__(device, torch.float32)
        self._layers: dict[str, AvatarLayer] = {}

    def load_avatar(self, packet: Packet) -> AvatarLayer:
        key = str(packet.path.resolve())
        if key in self._layers and self._layers[key].packet.manifest is packet.manifest:
            return self._layers[key]
        dev = self.device
        origins = packet.tensor("roi/origins").to(dev, torch.long)
        rw, rh = packet.meta["roi"]["size"]
        masks = packet.tensor("roi/mask").to(dev).float().div_(255.0)
        lm = packet.tensor("landmarks68").to(dev).float() - origins[:, None, :].float()
        rgb = packet.tensor("roi/rgb")
        layer = AvatarLayer(self.name, packet, dev, (int(rh), int(rw)), origins, masks, {"roi_rgb": rgb.to(dev) if dev.type != "cpu" else rgb, "lm": lm})
        self._layers = {key: layer}
        return layer

    def prebake(self, packet: Packet, progress: bool = True) -> Packet:
        """Nothing beyond the generic ROI is needed."""
        return packet

    def conditioner(self, fps: float) -> FrameQueue:
        return MouthConditioner(fps, self.sample_rate)

    def render(self, layer: AvatarLayer, driving: torch.Tensor, frame_idx: torch.Tensor) -> torch.Tensor:
        roi = layer.data["roi_rgb"].index_select(0, frame_idx.to(layer.data["roi_rgb"].device)).to(self.device)
        lm = layer.data["lm"].index_select(0, frame_idx)
        return warp_mouth(roi, lm, driving.to(self.device))

    def idle_driving(self, n: int) -> torch.Tensor | None:
        """Closed mouth: the same shape silence gives inside speech, so idle and pauses match."""
        return torch.zeros(n, N_PARAMS, device=self.device)

    @staticmethod
    def n_params() -> int:
        return N_PARAMS
