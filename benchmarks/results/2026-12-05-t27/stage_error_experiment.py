"""Which stage's statistics carry the error? (full architecture, seeded, R=104)"""
import torch
from newsstudio.engines.musetalk.engine import MuseTalkEngine
from newsstudio.engines.musetalk.lower_face_decoder import LowerFaceDecoder
from benchmarks.lower_face_decoder import decoder_inputs, psnr
from newsstudio.engines.musetalk.vae import decoded_levels as to_levels
eng = MuseTalkEngine("cpu", weights="random")
speech, silence = decoder_inputs(eng, 4)
R = 104
low = LowerFaceDecoder(eng._vae_decoder, R)
starts = low.plan.norm_starts
print("norm starts", starts)
with torch.inference_mode():
    full, own = low.record_upper_stats(speech)
    _, sil = low.record_upper_stats(silence)
    ref = to_levels(full)[:, :, R:]
    stage = lambda v, lo, hi: [i for i, s in enumerate(starts) if lo <= s < hi]
    groups = {"64": stage(None, 1, 32), "128": stage(None, 32, 80), "256": stage(None, 80, 256)}
    print(groups)
    print("all silence", round(psnr(to_levels(low(speech, sil)), ref), 2), flush=True)
    for name, idx in groups.items():
        st = sil.clone(); st[:, idx] = own[:, idx]
        print("own stats in stage", name, round(psnr(to_levels(low(speech, st)), ref), 2), flush=True)
