"""newsstudio.accel on CPU: static batching, graceful degradation, FP8 arithmetic, precision helpers."""
from __future__ import annotations

import logging
import os
from collections import namedtuple

import pytest
import torch
from torch import nn

from newsstudio.accel import (
    BucketedRunner, Fp8Linear, StaticBatchRunner, cast_, channels_last, configure_compile_cache, convert_linears_to_fp8_,
    fp8_matmul_reference, fp8_supported, quantize_e4m3, tf32, to_channels_last_, to_fp8,
)
from newsstudio.accel.fp8 import E4M3, eligible, fp8_linear_reference, has_scaled_mm
from newsstudio.accel.precision import NORM_TYPES, parse_dtype


def relerr(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


# --------------------------------------------------------------------------------------------
# StaticBatchRunner
# --------------------------------------------------------------------------------------------

class Recorder:
    """A batched function that remembers the batches it was called with."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.lin = nn.Linear(6, 3)
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, x: torch.Tensor, y: torch.Tensor):
        self.seen.append((x.clone(), y.clone()))
        with torch.no_grad():
            return self.lin(x) * y[:, :1]


@pytest.mark.parametrize("n", [1, 3, 4, 9])
def test_runner_pads_slices_and_equals_plain_call(n):
    rec = Recorder()
    g = torch.Generator().manual_seed(n)
    ex = (torch.randn(2, 6, generator=g), torch.randn(2, 5, generator=g))
    runner = StaticBatchRunner(rec, 4, ex, mode="eager")
    x, y = torch.randn(n, 6, generator=g), torch.randn(n, 5, generator=g) + 2
    rec.seen.clear()
    out = runner(x, y)
    assert out.shape == (n, 3)
    # equal up to BLAS rounding (a GEMM of 4 rows may round differently from one of n rows)
    torch.testing.assert_close(out, rec.lin(x).detach() * y[:, :1], rtol=1e-6, atol=1e-6)
    # every call saw exactly the static batch; short chunks were padded with their last row
    assert rec.seen and all(sx.shape[0] == 4 and sy.shape[0] == 4 for sx, sy in rec.seen)
    last_x, last_y = rec.seen[-1]
    m = n - 4 * (len(rec.seen) - 1)
    assert torch.equal(last_x[:m], x[n - m:]) and torch.equal(last_y[:m], y[n - m:])
    assert torch.equal(last_x[m:], x[-1:].expand(4 - m, 6))
    assert len(rec.seen) == -(-n // 4)


def test_runner_output_structures_and_unbatched_leaves():
    Pair = namedtuple("Pair", "a b")

    def fn(x):
        return {"img": x * 2, "pair": Pair(x + 1, [x.sum(-1)]), "total": x.new_tensor([7.0, 8.0])}

    runner = StaticBatchRunner(fn, 3, (torch.randn(3, 4),))
    for n in (2, 3, 7):
        x = torch.randn(n, 4)
        out = runner(x)
        assert set(out) == {"img", "pair", "total"}
        torch.testing.assert_close(out["img"], x * 2)
        assert isinstance(out["pair"], Pair)
        torch.testing.assert_close(out["pair"].a, x + 1)
        torch.testing.assert_close(out["pair"].b[0], x.sum(-1))
        assert out["total"].tolist() == [7.0, 8.0]  # not batched: passed through once


def test_runner_rejects_wrong_inputs():
    runner = StaticBatchRunner(lambda x: x, 2, (torch.randn(2, 4),))
    with pytest.raises(ValueError, match="per-item shape"):
        runner(torch.randn(2, 5))
    with pytest.raises(TypeError, match="dtype"):
        runner(torch.randn(2, 4, dtype=torch.float64))
    with pytest.raises(TypeError, match="expected 1 inputs"):
        runner(torch.randn(2, 4), torch.randn(2, 4))
    with pytest.raises(ValueError, match="mode"):
        StaticBatchRunner(lambda x: x, 2, (torch.randn(2, 4),), mode="turbo")
    with pytest.raises(ValueError, match="disagree"):
        StaticBatchRunner(lambda x, y: x, 2, (torch.randn(2, 4), torch.randn(1, 4)))


@pytest.mark.parametrize("mode", ["compile", "cudagraph", "compile+cudagraph"])
def test_runner_degrades_to_eager_on_cpu(mode, caplog):
    rec = Recorder()
    ex = (torch.randn(4, 6), torch.randn(4, 5))
    with caplog.at_level(logging.WARNING, logger="newsstudio.accel.static"):
        runner = StaticBatchRunner(rec, 4, ex, mode=mode)
        StaticBatchRunner(rec, 4, ex, mode=mode)
    assert runner.mode == "eager" and runner.requested_mode == mode and not runner.uses_graph
    assert runner.compile_seconds is None and runner.capture_seconds is None
    x, y = torch.randn(3, 6), torch.randn(3, 5)
    torch.testing.assert_close(runner(x, y), rec.lin(x).detach() * y[:, :1], rtol=1e-6, atol=1e-6)
    said = [r for r in caplog.records if mode in r.getMessage()]
    assert len(said) <= 1  # once per process (an earlier test may already have said it)


def test_runner_compile_sees_one_static_shape():
    """Short batches go through the staging buffer, so the compiled graph never recompiles."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    lin = nn.Linear(4, 2)
    runner = StaticBatchRunner(lambda x: lin(x).relu(), 4, (torch.randn(4, 4),), mode="compile",
                               backend=counter, allow_cpu_compile=True)
    assert runner.mode == "compile" and runner.compile_seconds is not None
    for n in (4, 1, 3, 6, 4):
        x = torch.randn(n, 4)
        with torch.no_grad():
            torch.testing.assert_close(runner(x), lin(x).relu())
    assert counter.frame_count == 1
    torch._dynamo.reset()


def test_a_runner_that_cannot_compile_runs_eager_and_says_so():
    """A backend that fails (as Inductor failed to lower a custom op once, twenty-fifth session) leaves the
    runner eager with the same results, and `fallbacks()` names it, so benchmarks flag their figures."""
    from newsstudio.accel.static import fallbacks

    def broken_backend(gm, example_inputs):
        raise RuntimeError("no lowering for this op")

    torch._dynamo.reset()
    lin = nn.Linear(4, 2)
    runner = StaticBatchRunner(lambda x: lin(x).relu(), 4, (torch.randn(4, 4),), mode="compile",
                               backend=broken_backend, allow_cpu_compile=True, fallback_on_error=True)
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(runner(x), lin(x).relu())
    assert runner.mode == "eager"
    assert any("compile failed" in why and "no lowering for this op" in why for why in fallbacks())
    torch._dynamo.reset()


def test_bucketed_runner_buckets_and_one_compilation():
    """Each call runs in the smallest power-of-two bucket that holds it; every bucket shares ONE
    compilation (batch dimension dynamic), so a process compiles once, not once per bucket."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    lin = nn.Linear(4, 2)

    def fn(x):
        return lin(x).relu()

    runner = BucketedRunner(fn, "compile", min_bucket=4, max_bucket=16, backend=counter, allow_cpu_compile=True)
    assert [runner.bucket_for(n) for n in (1, 4, 5, 9, 16, 40)] == [4, 4, 8, 16, 16, 16]
    for n in (3, 5, 9, 40, 4, 7):
        x = torch.randn(n, 4)
        with torch.no_grad():
            torch.testing.assert_close(runner(x), lin(x).relu())
    assert sorted(runner.runners) == [4, 8, 16]
    assert all(r.mode == "compile" for r in runner.runners.values())
    assert counter.frame_count == 1
    # release (benchmarks between engine configurations): every bucket and the compilation dropped;
    # the next call prepares again and gives the same results
    kept = runner.runners[8]
    runner.release()
    assert runner.runners == {} and runner.compile_seconds == 0.0
    x = torch.randn(6, 4)
    with torch.no_grad():
        torch.testing.assert_close(runner(x), lin(x).relu())
    assert sorted(runner.runners) == [8] and runner.runners[8] is not kept
    assert counter.frame_count == 1  # Dynamo's cache of fn's code is the process's: not compiled twice
    torch._dynamo.reset()
    eager = BucketedRunner(fn, "cudagraph")  # no CUDA: every bucket runs eager, same results
    x = torch.randn(6, 4)
    with torch.no_grad():
        torch.testing.assert_close(eager(x), lin(x).relu())
    assert all(r.mode == "eager" for r in eager.runners.values())
    with pytest.raises(ValueError, match="mode"):
        BucketedRunner(fn, "fast")


def test_bucketed_runner_static_sizes_compile_those_buckets_at_their_size():
    """``static_sizes`` (MuseTalk's ``static_shapes``): each listed bucket its own compilation at a
    concrete batch size, the others one shared dynamic-batch compilation; same results either way."""
    lin = nn.Linear(4, 2)

    def fn(x):
        return lin(x).relu()

    # static buckets -> (compilations, traced with a symbolic batch, with a concrete one)
    for static, graphs, symbolic, concrete in (((4, 8), 2, False, True), ((), 1, True, False), ((8,), 2, True, True)):
        torch._dynamo.reset()
        traced: list[list[object]] = []

        def backend(gm, example_inputs):
            traced.append(list(example_inputs))
            return gm.forward

        runner = BucketedRunner(fn, "compile", sizes=(4, 8), backend=backend, allow_cpu_compile=True,
                                static_sizes=static)
        for n in (3, 7, 11):
            x = torch.randn(n, 4)
            with torch.no_grad():
                torch.testing.assert_close(runner(x), lin(x).relu())
        assert sorted(runner.runners) == [4, 8]
        assert len(traced) == graphs

        def is_symbolic(args: list[object]) -> bool:
            return any(isinstance(a, torch.SymInt) or (isinstance(a, torch.Tensor) and not all(
                isinstance(d, int) for d in a.shape)) for a in args)

        assert any(is_symbolic(args) for args in traced) is symbolic
        assert any(not is_symbolic(args) for args in traced) is concrete
    torch._dynamo.reset()
    with pytest.raises(ValueError, match="not among the buckets"):
        BucketedRunner(fn, "compile", sizes=(4, 8), static_sizes=(16,))


def test_static_buckets_default_to_the_largest_on_cuda_with_a_compile_mode():
    from newsstudio.accel.static import static_buckets

    buckets = (4, 8, 12, 16, 24, 32)
    assert static_buckets(None, buckets, "cuda", "compile+cudagraph") == (32,)
    assert static_buckets("default", buckets, "cuda", "compile") == (32,)
    assert static_buckets(None, buckets, "cuda", "cudagraph") == ()
    assert static_buckets(None, buckets, "cpu", "compile+cudagraph") == ()
    assert static_buckets("all", buckets, "cpu", "eager") == buckets
    assert static_buckets("none", buckets, "cuda", "compile") == ()
    with pytest.raises(ValueError, match="static-shapes must be one of"):
        static_buckets("some", buckets, "cuda", "compile")


def test_bucketed_runner_explicit_sizes_pad_less_and_compile_once():
    """The render buckets (`RENDER_BUCKETS`): a call runs in the smallest listed size that holds it
    (9 frames as 12, 17 as 24), longer calls split at the largest, still one compilation."""
    from torch._dynamo.testing import CompileCounter

    from newsstudio.accel.static import RENDER_BUCKETS

    torch._dynamo.reset()
    counter = CompileCounter()
    lin = nn.Linear(4, 2)

    def fn(x):
        return lin(x).relu()

    runner = BucketedRunner(fn, "compile", sizes=RENDER_BUCKETS, backend=counter, allow_cpu_compile=True)
    assert runner.buckets() == [4, 8, 12, 16, 24, 32]
    assert runner.padded_sizes() == (4, 8, 12, 16, 24, 32)  # what a server's render batcher fills up to
    assert BucketedRunner(fn, "eager", sizes=RENDER_BUCKETS).padded_sizes() is None  # eager pads nothing
    assert [runner.bucket_for(n) for n in (1, 9, 12, 13, 17, 25, 70)] == [4, 12, 12, 16, 24, 32, 32]
    for n in (9, 17, 70):
        x = torch.randn(n, 4)
        with torch.no_grad():
            torch.testing.assert_close(runner(x), lin(x).relu())
    assert sorted(runner.runners) == [12, 24, 32]
    assert counter.frame_count == 1
    torch._dynamo.reset()
    with pytest.raises(ValueError, match="sizes"):
        BucketedRunner(fn, "compile", sizes=[0, 4])


def test_render_buckets_from_the_environment(monkeypatch):
    from newsstudio.accel.static import RENDER_BUCKETS, RENDER_BUCKETS_ENV, render_buckets

    monkeypatch.delenv(RENDER_BUCKETS_ENV, raising=False)
    assert render_buckets() == RENDER_BUCKETS
    monkeypatch.setenv(RENDER_BUCKETS_ENV, "32, 8,16,4")
    assert render_buckets() == (4, 8, 16, 32)
    for bad in ("8,x", "0,8", ","):
        monkeypatch.setenv(RENDER_BUCKETS_ENV, bad)
        with pytest.raises(ValueError, match=RENDER_BUCKETS_ENV):
            render_buckets()


def test_runner_shared_by_threads_gives_each_caller_its_own_rows():
    """Streams of one server call a shared runner from their own threads: its staging buffers (and
    on CUDA the graph's outputs) are shared, so every call must hold them alone."""
    import threading
    import time

    def slow_double(x):
        time.sleep(0.005)  # releases the GIL between staging and reading, as a GPU wait would
        return x * 2

    runner = StaticBatchRunner(slow_double, 8, (torch.zeros(1, 3),))
    errors: list[str] = []

    def caller(k: int) -> None:
        for i in range(10):
            x = torch.full((3, 3), float(k * 100 + i))  # short batch: goes through the shared buffer
            out = runner(x)
            if not torch.equal(out, x * 2):
                errors.append(f"thread {k} call {i} got rows of {out[:, 0].tolist()}")

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


def test_runner_made_under_inference_mode_serves_calls_outside_it():
    """Engines warm their runners up under torch.inference_mode; live sessions then call them from
    plain no-grad code (the server's audio encoders). The staging buffers must accept both."""
    with torch.inference_mode():
        runner = StaticBatchRunner(lambda x: x + 1, 4, (torch.zeros(1, 2),))
        torch.testing.assert_close(runner(torch.ones(2, 2)), torch.full((2, 2), 2.0))
    with torch.no_grad():
        torch.testing.assert_close(runner(torch.ones(3, 2)), torch.full((3, 2), 2.0))  # short batch: staged
    torch.testing.assert_close(runner(torch.zeros(1, 2)), torch.ones(1, 2))

def test_configure_cudnn_only_touches_cuda_engines():
    from newsstudio.accel import configure_cudnn

    saved = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = False
        assert configure_cudnn(torch.device("cpu")) is False and torch.backends.cudnn.benchmark is False
        assert configure_cudnn(torch.device("cuda")) is True and torch.backends.cudnn.benchmark is True
        assert configure_cudnn(torch.device("cuda"), False) is False and torch.backends.cudnn.benchmark is False
    finally:
        torch.backends.cudnn.benchmark = saved


def test_configure_compile_cache(tmp_path, monkeypatch):
    for k in ("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_CACHE", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("NEWSSTUDIO_INDUCTOR_CACHE", str(tmp_path / "env"))
    d = configure_compile_cache(tmp_path / "explicit")
    assert d == tmp_path / "explicit" and d.is_dir()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(d) and os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "1"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    from newsstudio.accel.cache import compile_cache_dir

    assert compile_cache_dir() == tmp_path / "env"


# --------------------------------------------------------------------------------------------
# FP8
# --------------------------------------------------------------------------------------------

def test_e4m3_quantisation_error_bound():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 128, generator=g) * 3
    for gran in ("tensor", "row"):
        q, s = quantize_e4m3(x, gran)
        assert q.dtype == E4M3 and s.dtype == torch.float32
        assert s.shape == (() if gran == "tensor" else (64, 1))
        back = q.float() * s
        # 3 mantissa bits: relative error <= 2^-4 for values in the normal range of the scaled grid
        normal = (x / s).abs() >= 2.0**-6
        assert ((back - x).abs()[normal] <= x.abs()[normal] * 2.0**-4 + 1e-12).all()
        assert float((x / s).abs().max()) <= 448.0 + 1e-3


@pytest.mark.parametrize("gran", ["tensor", "row"])
def test_fp8_matmul_reference_vs_fp32(gran):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(96, 256, generator=g)
    w = torch.randn(192, 256, generator=g) / 16
    b = torch.randn(192, generator=g) * 0.1
    err = relerr(fp8_matmul_reference(x, w, b, gran), x @ w.t() + b)
    assert 5e-3 < err < 6e-2  # quantised (not exact) and within the e4m3 bound


@pytest.mark.skipif(not has_scaled_mm(), reason="torch without _scaled_mm")
@pytest.mark.parametrize("gran", ["tensor", "row"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_linear_forced_on_cpu_matches_reference(gran, dtype):
    """`_scaled_mm` has a CPU kernel, so the real layer arithmetic is checked here too."""
    torch.manual_seed(3)
    lin = nn.Linear(64, 48).to(dtype)
    layer = to_fp8(lin, gran, force=True)
    assert isinstance(layer, Fp8Linear) and layer.weight_fp8.dtype == E4M3
    x = torch.randn(2, 5, 64).to(dtype)
    y = layer(x)
    assert y.shape == (2, 5, 48) and y.dtype == dtype
    tol = 2e-3 if dtype == torch.float32 else 1e-2
    assert relerr(y.float(), fp8_linear_reference(layer, x)) < tol
    assert relerr(y.float(), lin(x).float().detach()) < 6e-2


@pytest.mark.skipif(not has_scaled_mm(), reason="torch without _scaled_mm")
def test_fp8_linear_traces_as_one_graph():
    """No graph break in the forward (the compile levers need it): fake-tensor tracing included."""
    torch.manual_seed(7)
    layer = to_fp8(nn.Linear(32, 16).to(torch.bfloat16), force=True)
    x = torch.randn(2, 3, 32, dtype=torch.bfloat16)
    torch._dynamo.reset()
    out = torch.compile(layer, backend="aot_eager", fullgraph=True, dynamic=False)(x)
    assert torch.equal(out, layer(x))
    torch._dynamo.reset()


def test_fp8_conversion_is_a_noop_on_cpu():
    torch.manual_seed(4)
    net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 24), nn.Linear(24, 16))
    x = torch.randn(7, 32)
    before = net(x).detach()
    sd = {k: v.clone() for k, v in net.state_dict().items()}
    assert not fp8_supported("cpu")
    assert convert_linears_to_fp8_(net) == 0
    assert all(type(m) is nn.Linear for m in net if isinstance(m, nn.Linear))
    assert torch.equal(net(x), before)
    assert all(torch.equal(v, sd[k]) for k, v in net.state_dict().items())
    assert to_fp8(net[0]) is net[0]


@pytest.mark.skipif(not has_scaled_mm(), reason="torch without _scaled_mm")
def test_fp8_conversion_filter_shapes_and_casts():
    torch.manual_seed(5)
    net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 24), nn.Linear(24, 16), nn.Linear(16, 32))
    assert [eligible(m) for m in net] == [True, False, False, False, True]
    x = torch.randn(3, 32)
    ref = net(x).detach()
    n = convert_linears_to_fp8_(net, filter=lambda name, m: name != "4", force=True)
    assert n == 1 and isinstance(net[0], Fp8Linear) and type(net[4]) is nn.Linear
    assert relerr(net(x).detach(), ref) < 6e-2
    cast_(net, torch.bfloat16)
    assert net[0].weight_fp8.dtype == E4M3 and net[0].weight_scale.dtype == torch.float32
    assert net[0].bias.dtype == torch.bfloat16
    net.half()  # nn.Module casts must not touch the quantised weight either
    assert net[0].weight_fp8.dtype == E4M3 and net[0].weight_scale.dtype == torch.float32
    assert net(x.half()).dtype == torch.float16


# --------------------------------------------------------------------------------------------
# Precision helpers
# --------------------------------------------------------------------------------------------

class WithBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.register_buffer("freqs", torch.rand(4) * 1e-4 + 1e-4)
        self.register_buffer("steps", torch.arange(3))

    def forward(self, x):
        return self.norm(self.lin(x))


def test_cast_keeps_schedules_and_norm_islands():
    m = cast_(WithBuffers(), "fp16", keep_fp32=NORM_TYPES)
    assert m.lin.weight.dtype == torch.float16
    assert m.norm.weight.dtype == torch.float32  # island
    assert m.freqs.dtype == torch.float32 and m.steps.dtype == torch.int64
    y = m(torch.randn(2, 8, dtype=torch.float16))
    assert y.dtype == torch.float16  # the island hands back the caller's dtype
    plain = cast_(WithBuffers(), torch.bfloat16)
    assert plain.norm.weight.dtype == torch.bfloat16 and plain.freqs.dtype == torch.float32
    assert parse_dtype("bf16") is torch.bfloat16
    with pytest.raises(ValueError):
        parse_dtype("fp12")


def test_channels_last_handles_conv3d():
    torch.manual_seed(6)
    net = nn.Sequential(nn.Conv3d(3, 4, 3, padding=1), nn.Flatten(1, 2), nn.Conv2d(16, 5, 3, padding=1))
    x = torch.randn(2, 3, 4, 6, 6)
    ref = net(x).detach()
    to_channels_last_(net)
    assert net[0].weight.is_contiguous(memory_format=torch.channels_last_3d)
    assert net[2].weight.is_contiguous(memory_format=torch.channels_last)
    xl = channels_last(x)
    assert xl.is_contiguous(memory_format=torch.channels_last_3d)
    torch.testing.assert_close(net(xl).detach(), ref, rtol=1e-5, atol=1e-5)
    assert channels_last(torch.randn(3, 4)).is_contiguous()


def test_tf32_context_restores_state():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    with tf32(True):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    with tf32(False):
        assert not torch.backends.cudnn.allow_tf32
        assert torch.get_float32_matmul_precision() == "highest"
    after = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    assert after == before


# ----------------------------------------------------------------------------- host_copy

def test_host_copies_keep_values_and_dtype_on_the_cpu():
    from newsstudio.accel.host_copy import tensor_on, to_device, to_host

    x = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    y = to_device(x, "cpu", torch.float32)
    assert y.dtype == torch.float32 and torch.equal(y, x.float())
    assert to_host(x) is x  # already on the host: no copy
    t = tensor_on([1, 2, 3], "cpu", torch.float16)
    assert t.dtype == torch.float16 and t.tolist() == [1.0, 2.0, 3.0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_host_copies_through_pinned_memory_on_cuda():
    from newsstudio.accel.host_copy import tensor_on, to_device, to_host

    x = torch.randn(64, 33)
    d = to_device(x[:, 1:], "cuda", torch.float16)  # a non-contiguous view, converted on the way
    assert d.is_cuda and d.dtype == torch.float16
    back = to_host(d)
    assert back.is_pinned() and torch.equal(back, x[:, 1:].half())
    assert tensor_on([3, 1], "cuda").tolist() == [3, 1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_graph_captured_with_tf32_replays_tf32_matmuls_and_leaves_the_process_switch_alone():
    """Ditto's float32 front end can be graphed with TF32 matmuls: the graph keeps the TF32 kernels
    chosen at capture, and the process-wide switch (other threads' eager float32 work) is as before."""
    from newsstudio.accel.precision import tf32

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    w = torch.randn(2048, 2048, device=dev, generator=g)
    x = torch.randn(16, 2048, device=dev, generator=g)
    before = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
    with torch.no_grad(), tf32(False):
        exact = x @ w
        plain = StaticBatchRunner(lambda t: t @ w, 16, x, mode="cudagraph")(x)
        fast_runner = StaticBatchRunner(lambda t: t @ w, 16, x, mode="cudagraph", tf32=True)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()) == (False, "highest")
        fast = fast_runner(x)  # replayed with the switch off
        with tf32(True):
            eager_tf32 = x @ w
    assert (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()) == before

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    assert rel(plain, exact) < 1e-5  # float32 graph: float32 kernels
    assert 1e-5 < rel(fast, exact) < 1e-2  # TF32: ~1e-3 (10-bit mantissa)
    assert rel(fast, eager_tf32) < rel(fast, exact) / 10


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphs_of_two_networks_replayed_at_once_on_two_streams_each_give_their_own_result():
    """A live server with front-end streams replays two networks' graphs at the same time (HuBERT on
    one stream, Ditto's LMDM windows on another): each must compute what it computes alone. With both
    captured on one stream they shared one cuBLAS workspace, and on an H200 a batch never finished.
    Float32 GEMMs with few rows and a long inner dimension, where cuBLAS splits K through its workspace."""
    import threading

    from newsstudio.accel.static import BucketedRunner

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)

    def mlp(width: int):
        ws = [torch.randn(width, width, device=dev, generator=g) / width**0.5 for _ in range(6)]

        def fn(x: torch.Tensor) -> torch.Tensor:
            for w in ws:
                x = torch.tanh(x @ w)
            return x

        return fn

    nets = [mlp(4096), mlp(2048)]
    runners = [BucketedRunner(f, "cudagraph", min_bucket=8, max_bucket=16) for f in nets]
    inputs = [torch.randn(16, 4096, device=dev, generator=g), torch.randn(16, 2048, device=dev, generator=g)]
    with torch.no_grad():
        for r, x in zip(runners, inputs):
            r.warm_up((x,))
        alone = [r(x) for r, x in zip(runners, inputs)]  # one at a time, default stream
        torch.cuda.synchronize()
    captures = {r.family.capture_stream(dev).cuda_stream for r in runners}
    assert len(captures) == 2 and torch.cuda.current_stream().cuda_stream not in captures
    bad: list[str] = []

    def hammer(k: int) -> None:
        stream = torch.cuda.Stream()
        try:
            with torch.no_grad(), torch.cuda.stream(stream):
                for i in range(200):
                    n = 16 if i % 2 else 8  # both buckets of the family
                    out = runners[k](inputs[k][:n])
                    stream.synchronize()
                    if not torch.allclose(out, alone[k][:n], rtol=1e-4, atol=1e-5):
                        bad.append(f"net {k} call {i}: max diff {float((out - alone[k][:n]).abs().max()):.3g}")
                        return
        except BaseException as exc:  # noqa: BLE001 - reported below
            bad.append(f"net {k}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=hammer, args=(k,), daemon=True) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a replay never finished"
    assert not bad, bad


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_runner_called_from_two_streams_never_refills_inputs_under_a_running_replay():
    """A server's front-end batchers (own streams) and a clip job (default stream) share runners:
    a call from another stream waits for the previous call's replay before refilling its inputs."""
    w = torch.randn(1024, 1024, device="cuda") / 32

    def slow(x: torch.Tensor) -> torch.Tensor:
        for _ in range(40):  # long enough that a refill under the replay would show
            x = torch.tanh(x @ w)
        return x

    runner = StaticBatchRunner(slow, 8, torch.randn(8, 1024, device="cuda"), mode="cudagraph")
    xs = [torch.randn(8, 1024, device="cuda") * (k + 1) for k in range(6)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    outs = []
    with torch.no_grad():
        for k, x in enumerate(xs):
            with torch.cuda.stream(streams[k % 2]):
                outs.append(runner(x))
        for s in streams:
            torch.cuda.current_stream().wait_stream(s)
        for x, o in zip(xs, outs):
            torch.testing.assert_close(o, slow(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_every_capture_is_tallied_for_the_servers_metrics():
    """`/metrics`' compile_work.graph_captures: each capture (here a small graph captured mid-run)
    counts once, so captures while sessions run show in a load test's level."""
    from newsstudio.accel.graph_capture import capture, captures_total
    from newsstudio.accel.work_counts import work_counts

    x = torch.ones(4, device="cuda")
    before = captures_total()
    replay = capture(lambda: x.mul_(2), x.device)
    replay()
    torch.cuda.synchronize()
    assert captures_total() == before + 1 == work_counts()["graph_captures"]
    assert x.tolist() == [4.0] * 4  # doubled by the eager run before the capture and by the one replay


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mid_stream_capture_stream_is_no_pooled_stream():
    """Graphs captured mid-stream use a stream made for them: never one of PyTorch's pooled streams
    (which any other thread may be handed) and not the current stream; new streams are no one else's."""
    from newsstudio.accel.own_stream import capture_stream, new_stream

    dev = torch.device("cuda")
    high = torch.cuda.Stream.priority_range()[1]
    pooled = {torch.cuda.Stream(priority=p).cuda_stream for p in (0, high) for _ in range(64)}
    mine = [capture_stream(dev)[0].cuda_stream] + [new_stream(dev, high_priority=h).cuda_stream for h in (False, True)]
    assert len(set(mine)) == len(mine) and not set(mine) & pooled
    assert torch.cuda.current_stream().cuda_stream not in mine
    assert capture_stream(dev)[0].cuda_stream == mine[0], "one capture stream per device"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_capture_mid_stream_survives_other_threads_waiting_on_pooled_streams():
    """The thirty-second session's failure: a live session captured its compose graph on a pooled
    stream that was also a batcher's own stream, whose ``wait_event`` then broke the capture (and
    every session). Captures now run beside threads that cycle through the whole pool and wait for
    their work as the server's threads do: per stream or event. (A device-wide wait,
    ``torch.cuda.synchronize``, from any thread invalidates every capture on the GPU whatever its
    mode: this test's first version did that and failed 8 of 9 runs on the thirty-fifth session's
    H100; the server's code makes no such wait.)"""
    from benchmarks.capture_probe import run_variant

    row = run_variant("event", captures=60)
    assert row["failed"] == row["wrong_replays"] == row["random_draws_failed"] == 0 and not row["thread_errors"], row


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_family_capture_stream_is_freed_for_the_next_family_when_it_is_gone(caplog):
    """A process that makes and drops many runners (benchmarks with several variants) keeps getting
    capture streams (and cuBLAS workspaces) of its own: a dropped family's stream goes back to the pool."""
    import gc

    from newsstudio.accel import graph_family as gf

    dev = torch.device("cuda")
    kept = gf.GraphFamily()
    kept_stream = kept.capture_stream(dev).cuda_stream
    seen: set[int] = set()
    with caplog.at_level(logging.WARNING, logger=gf.__name__):
        for _ in range(3 * gf._POOL_SIZE):  # more families than the pool has streams
            family = gf.GraphFamily()
            handle = family.capture_stream(dev).cuda_stream
            assert handle != kept_stream, "a live family's capture stream was handed out again"
            seen.add(handle)
            del family
            gc.collect()
    assert "are shared" not in caplog.text, "a dropped family's stream was never freed"
    assert len(seen) > 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_compose_whose_capture_fails_on_cuda_composes_eagerly_and_the_device_keeps_working():
    """A compose that cannot be captured (here: it copies to the host mid-capture) fails its capture
    for real; the session's next requests compose eagerly and the GPU keeps working."""
    from newsstudio.compose.session_graphs import ComposeGraphs

    dev = torch.device("cuda")
    graphs = ComposeGraphs(dev)

    def compose(rois, idx, output):
        scale = float(rois.abs().max().cpu())  # a synchronising copy: not allowed while capturing
        return rois / max(scale, 1.0)

    rois = torch.rand(2, 8, 8, 3, device=dev)
    idx = torch.zeros(2, dtype=torch.long, device=dev)
    assert graphs.to_host(compose, rois, idx, "nv12") is None
    assert graphs.failed is not None
    x = torch.randn(64, 64, device=dev)
    torch.testing.assert_close((x @ x).cpu(), x.cpu() @ x.cpu(), rtol=1e-3, atol=1e-3)
