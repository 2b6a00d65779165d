"""Ditto's networks, one per file, official state_dict names: the LivePortrait-style image networks
exported here, and the LMDM motion denoiser (`lmdm.py`, around `motion_decoder.py`).

Each class is built with the official constructor defaults and loads the matching
`ditto_pytorch/models/*.pth` strictly (see `newsstudio.engines.ditto.checkpoints`).
"""
from .appearance_feature_extractor import AppearanceFeatureExtractor
from .motion_extractor import MotionExtractor
from .spade_decoder import SPADEDecoder
from .warping_network import WarpingNetwork

__all__ = [
    "AppearanceFeatureExtractor",
    "MotionExtractor",
    "SPADEDecoder",
    "WarpingNetwork",
]
