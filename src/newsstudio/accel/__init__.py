"""Acceleration levers shared by the engines and the benchmarks.

* `static`: `StaticBatchRunner`, fixed-shape batches for torch.compile / CUDA graphs, and
  `BucketedRunner`, one runner per power-of-two batch bucket;
* `fp8`: `Fp8Linear`, `convert_linears_to_fp8_` (Hopper+ FP8 matmuls, no-op elsewhere);
* `precision`: half-precision casts that keep what must stay float32, channels_last, TF32;
* `cache`: a stable Inductor cache folder;
* `cudnn`: cuDNN autotuning for the engines' static shapes;
* `settings`: an engine's accel keywords -> mode, weight layout, autotuning (measured defaults).

Everything degrades to plain eager PyTorch on a CPU.
"""
from .cache import compile_cache_dir, configure_compile_cache
from .cudnn import configure_cudnn
from .fp8 import Fp8Linear, convert_linears_to_fp8_, fp8_matmul_reference, fp8_supported, quantize_e4m3, to_fp8
from .precision import cast_, channels_last, parse_dtype, prepare_, tf32, to_channels_last_
from .settings import AccelSettings, resolve_accel
from .static import MODES, BucketedRunner, StaticBatchRunner

__all__ = [
    "MODES", "AccelSettings", "BucketedRunner", "Fp8Linear", "StaticBatchRunner", "cast_", "channels_last", "compile_cache_dir",
    "configure_compile_cache", "configure_cudnn", "convert_linears_to_fp8_", "fp8_matmul_reference", "fp8_supported", "parse_dtype",
    "prepare_", "quantize_e4m3", "resolve_accel", "tf32", "to_channels_last_", "to_fp8",
]
