"""Run a callable on fixed-shape batches so torch.compile and CUDA graphs see static shapes.

    runner = StaticBatchRunner(lambda z: vae.decode(z).sample, 16, (z_example,), mode="cudagraph")
    images = runner(z)          # any batch size: padded up to 16 (or split), sliced back

Inputs: positional tensors, all batched along dim 0 (close over anything else in `fn`). A short
batch is padded by repeating its last row (real data, never zeros: no NaN from norms of empty
rows), a long one is split into chunks of `batch_size` and the outputs concatenated. Outputs: a
tensor or a tuple / list / dict of tensors; tensors whose leading dim is `batch_size` are sliced
back to the caller's batch.

Modes:
* ``eager``: `fn` as is (padding only).
* ``compile``: `torch.compile(fn, mode=compile_mode, dynamic=False)`, compile_mode
  "max-autotune-no-cudagraphs" by default. Short or oddly strided batches go through one staging
  buffer per input, so the compiled graph sees one shape and one layout (no recompiles).
  (`backend=` another torch.compile backend and `allow_cpu_compile=True` exist for CPU tests.)
* ``cudagraph``: manual `torch.cuda.CUDAGraph` capture of `fn` over static input buffers after
  warm-up on a side stream; each call copies the inputs into those buffers (host tensors
  included: pinned memory makes that copy asynchronous) and replays the graph.
  `compiled=` hands in one already `torch.compile`d callable shared by several runners (its batch
  dimension is marked dynamic, so the runners of other batch sizes reuse one compilation).
* ``compile+cudagraph``: with `cudagraph_compile_mode=None` (default) the compiled `fn` is captured
  by the same manual graph (one compile, no cudagraph-tree bookkeeping); with "reduce-overhead" or
  "max-autotune" torch.compile's own CUDA graphs are used instead.

Without CUDA (CPU tensors, or no GPU) every mode runs eager and says so once in the log. The
compile modes point Inductor at a stable cache folder first (`accel.cache`), and the time of the
first (compiling) call is kept in `compile_seconds`, the capture time in `capture_seconds`.

``tf32=True`` captures the graph with TF32 matmuls and convolutions (float32 networks: the
kernels chosen at capture are the graph's for good, so replays need no process-wide switch).
Graph modes only: an eager call would have to flip that switch under every other thread.

Graph outputs live in the graph's static buffers: with `copy_outputs=True` (default) the caller
gets copies; with False it gets views that the next call overwrites.

Callers on different CUDA streams (with `--front-end-streams` a live server's audio and motion
batchers run on their own, clip jobs on the default stream) are ordered on the GPU, not only by the
call lock: each runner belongs to a `GraphFamily` (all buckets of one `BucketedRunner` share one),
whose calls from another stream than the previous one first wait for that call's work (an event),
and whose graphs are captured on a stream of the family's own, so graphs of different families
that do replay at the same time never share a cuBLAS workspace (accel/graph_family.py).
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .cache import configure_compile_cache
from .graph_capture import capturing
from .graph_family import GraphFamily
from .layout import memory_format_of
from .precision import tf32 as tf32_math

log = logging.getLogger(__name__)

MODES = ("eager", "compile", "cudagraph", "compile+cudagraph")
COMPILE_MODES = ("compile", "compile+cudagraph")  # the modes that run torch.compile
GRAPH_MODES = ("cudagraph", "compile+cudagraph")  # the modes that replay CUDA graphs (on a GPU)


def compiled_on_cuda(device_type: str, mode: str) -> bool:
    """Whether an engine runs compiled on a GPU: where the defaults measured to pay there apply
    (MuseTalk's lower-face decoder, its static batch-32 compilation)."""
    return device_type == "cuda" and mode in COMPILE_MODES


_SAID: set[str] = set()


_FALLBACKS: list[str] = []


def _say_once(msg: str) -> None:
    if msg not in _SAID:
        _SAID.add(msg)
        log.warning(msg)


def note_fallback(why: str) -> None:
    """Record (and warn once) that something asked to compile or capture runs eager instead."""
    _FALLBACKS.append(why[:500])
    _say_once(why)


def fallbacks() -> list[str]:
    """Why each runner of this process that could not compile or capture runs eager instead (one
    line a distinct failure): a benchmark's figures from such a process are not the mode it asked for."""
    return list(dict.fromkeys(_FALLBACKS))


# --------------------------------------------------------------------------------------------
# Small tree helpers (tensor | tuple | list | dict)
# --------------------------------------------------------------------------------------------

def _tree_map(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_tree_map(fn, o) for o in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_tree_map(fn, o) for o in obj)
    if isinstance(obj, dict):
        items = {k: _tree_map(fn, v) for k, v in obj.items()}
        try:
            return type(obj)(**items) if type(obj) is not dict else items
        except TypeError:
            return items
    return obj


def _tree_cat(parts: list[Any], sizes: list[int]) -> Any:
    """Concatenate along dim 0 the batched leaves (leading dim = that chunk's size in every part)
    of structurally equal outputs; other leaves come from the first part."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        if first.dim() >= 1 and all(p.dim() == first.dim() and p.shape[0] == m for p, m in zip(parts, sizes)):
            return torch.cat(parts, dim=0)
        return first
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(_tree_cat([p[i] for p in parts], sizes) for i in range(len(first))))
    if isinstance(first, (tuple, list)):
        return type(first)(_tree_cat([p[i] for p in parts], sizes) for i in range(len(first)))
    if isinstance(first, dict):
        items = {k: _tree_cat([p[k] for p in parts], sizes) for k in first}
        try:
            return type(first)(**items) if type(first) is not dict else items
        except TypeError:
            return items
    return first


def _alloc_batch(x: torch.Tensor, batch: int, device: torch.device) -> torch.Tensor:
    """An empty [batch, *x.shape[1:]] buffer with x's dtype and memory format on `device`.

    Always a normal tensor, even when made under `torch.inference_mode` (an engine's warm-up): an
    inference tensor could not be refilled by later calls made outside inference mode (a live
    session's audio encoder), which torch refuses."""
    with torch.inference_mode(False):
        buf = torch.empty((batch, *x.shape[1:]), dtype=x.dtype, device=device)
        fmt = memory_format_of(x)
        return buf if fmt is torch.contiguous_format else buf.contiguous(memory_format=fmt)


def _fill_padded_(buf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """buf[:n] = x, buf[n:] = x[-1] (the last real row repeated)."""
    n = x.shape[0]
    if (x.device == buf.device and x.data_ptr() == buf.data_ptr() and x.shape == buf.shape
            and x.stride() == buf.stride()):
        return buf  # the caller wrote into the static buffer itself: nothing to copy
    nb = x.is_pinned() if x.device.type == "cpu" and buf.device.type == "cuda" else False
    buf[:n].copy_(x, non_blocking=nb)
    if n < buf.shape[0]:
        buf[n:].copy_(buf[n - 1 : n].expand(buf.shape[0] - n, *buf.shape[1:]))
    return buf


def _sync(device: torch.device) -> None:
    """Wait for this thread's stream, not the device: a device-wide wait (``torch.cuda.synchronize``)
    from any thread invalidates every graph capture in progress on that GPU, whatever its capture
    mode (CUDA's rule; a live session's compose capture, say, while an engine warms up)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


# --------------------------------------------------------------------------------------------
# The runner
# --------------------------------------------------------------------------------------------

class StaticBatchRunner:
    """`fn(*inputs)` on batches of exactly `batch_size` rows (see the module docstring)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        batch_size: int,
        example_inputs: torch.Tensor | Sequence[torch.Tensor],
        *,
        mode: str = "eager",
        compile_mode: str = "max-autotune-no-cudagraphs",
        cudagraph_compile_mode: str | None = None,
        warmup: int = 2,
        copy_outputs: bool = True,
        device: torch.device | str | None = None,
        cache_dir: str | None = None,
        fallback_on_error: bool = False,
        prepare: bool = True,
        backend: str | Callable[..., Any] = "inductor",
        allow_cpu_compile: bool = False,
        compiled: Callable[..., Any] | None = None,
        family: GraphFamily | None = None,
        tf32: bool = False,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if cudagraph_compile_mode not in (None, "reduce-overhead", "max-autotune"):
            raise ValueError("cudagraph_compile_mode must be None, 'reduce-overhead' or 'max-autotune'")
        examples = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
        if not examples or not all(isinstance(e, torch.Tensor) and e.dim() >= 1 and e.shape[0] >= 1 for e in examples):
            raise TypeError("example_inputs: one or more tensors with a leading batch dimension >= 1")
        if len({e.shape[0] for e in examples}) != 1:
            raise ValueError(f"example inputs disagree on the batch size: {[tuple(e.shape) for e in examples]}")

        self.fn = fn
        self.batch_size = int(batch_size)
        self.requested_mode = mode
        self.compile_mode = compile_mode
        self.cudagraph_compile_mode = cudagraph_compile_mode
        self.warmup = max(1, int(warmup))
        self.copy_outputs = copy_outputs
        self.cache_dir = cache_dir
        self.fallback_on_error = fallback_on_error
        self.backend = backend
        self.shared_compiled = compiled
        self.device = torch.device(device) if device is not None else examples[0].device
        self.compile_seconds: float | None = None
        self.capture_seconds: float | None = None
        self.compiled_fn: Callable[..., Any] | None = None
        self._graph: Any = None
        self._static_out: Any = None
        self._prepared = False
        # One caller at a time: the staging buffers, the graph's outputs and the copy-out are shared
        # (streams of one server call a shared runner from their own threads).
        self._call_lock = threading.RLock()
        self.family = family if family is not None else GraphFamily()  # capture stream + cross-stream order
        self.tf32 = bool(tf32)  # float32 matmuls captured as TF32 (graph modes; see the module doc)

        self.mode = mode
        on_cuda = self.device.type == "cuda" and torch.cuda.is_available()
        if mode != "eager" and not on_cuda and not (mode == "compile" and allow_cpu_compile):
            _say_once(f"StaticBatchRunner: mode {mode!r} needs CUDA; running eager on {self.device}")
            self.mode = "eager"

        # Static input buffers (staging for eager/compile, graph inputs for cudagraph).
        self._shapes = [tuple(e.shape[1:]) for e in examples]
        self._dtypes = [e.dtype for e in examples]
        self.static_inputs = [_alloc_batch(e, self.batch_size, self.device) for e in examples]
        with torch.no_grad():
            for buf, e in zip(self.static_inputs, examples):
                _fill_padded_(buf, e[: self.batch_size].to(self.device))
        if prepare:
            self.prepare()

    # -- set-up ------------------------------------------------------------------------------

    @property
    def uses_graph(self) -> bool:
        return self.mode in GRAPH_MODES

    def prepare(self) -> "StaticBatchRunner":
        """Compile / warm up / capture now (otherwise the first call does it)."""
        with self._call_lock:
            return self._prepare_once()

    def _prepare_once(self) -> "StaticBatchRunner":
        if self._prepared:
            return self
        try:
            self._prepare()
        except Exception as exc:
            if not self.fallback_on_error:
                raise
            note_fallback(f"StaticBatchRunner: {self.mode} failed ({type(exc).__name__}: {exc}); running eager")
            self.mode, self._graph, self.compiled_fn = "eager", None, None
        self._prepared = True
        return self

    def _compile(self, mode: str) -> Callable[..., Any]:
        if self.shared_compiled is not None:  # one compiled fn for several batch sizes (BucketedRunner)
            compiled = self.shared_compiled
            for buf in self.static_inputs:
                torch._dynamo.maybe_mark_dynamic(buf, 0)
        elif self.backend == "inductor":
            configure_compile_cache(self.cache_dir)
            compiled = torch.compile(self.fn, mode=mode, dynamic=False)
        else:  # another backend (tests use "eager"): Inductor's modes do not apply
            compiled = torch.compile(self.fn, backend=self.backend, dynamic=False)
        t0 = time.perf_counter()
        with torch.no_grad():
            compiled(*self.static_inputs)
        _sync(self.device)
        self.compile_seconds = time.perf_counter() - t0
        return compiled

    def _prepare(self) -> None:
        if self.mode == "eager":
            return
        if self.mode == "compile":
            self.compiled_fn = self._compile(self.compile_mode)
            return
        if self.mode == "compile+cudagraph" and self.cudagraph_compile_mode is not None:
            self.compiled_fn = self._compile(self.cudagraph_compile_mode)
            t0 = time.perf_counter()
            for _ in range(self.warmup + 2):  # cudagraph trees record after a warm-up run
                self._call_inductor_graphs()
            _sync(self.device)
            self.capture_seconds = time.perf_counter() - t0
            return
        target = self.fn
        if self.mode == "compile+cudagraph":
            target = self.compiled_fn = self._compile(self.compile_mode)
        self._capture(target)

    def _capture(self, target: Callable[..., Any]) -> None:
        t0 = time.perf_counter()
        dev = self.device
        cur = torch.cuda.current_stream(dev)
        side = torch.cuda.Stream(dev)
        side.wait_stream(cur)
        with tf32_math(True) if self.tf32 else contextlib.nullcontext():  # kernels chosen now are the graph's for good
            with torch.no_grad(), torch.cuda.stream(side):
                for _ in range(self.warmup):
                    target(*self.static_inputs)
            cur.wait_stream(side)
            side.synchronize()  # the warm-up done; not the device's other streams (see `_sync`)
            graph = torch.cuda.CUDAGraph()
            capture = self.family.capture_stream(dev)  # the family's own cuBLAS workspace
            with torch.no_grad(), torch.cuda.stream(capture), capturing(graph, self.family.memory_pool()):  # thread-local:
                # other sessions keep launching; the pool is the family's (graph_family.py)
                out = target(*self.static_inputs)
        _sync(dev)
        self._graph, self._static_out = graph, out
        self.capture_seconds = time.perf_counter() - t0

    # -- calls -------------------------------------------------------------------------------

    def _call_inductor_graphs(self) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():
            return self.compiled_fn(*self.static_inputs)  # type: ignore[misc]

    def _stage(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The tensors the static-shape callable gets: the inputs themselves when they already
        have the static shape, dtype, device and layout (eager/compile), else the filled buffers."""
        out = []
        for x, buf in zip(inputs, self.static_inputs):
            direct = (not self.uses_graph and self.shared_compiled is None and x.shape == buf.shape and x.dtype == buf.dtype
                      and x.device == buf.device and x.stride() == buf.stride())
            out.append(x if direct else _fill_padded_(buf, x))
        return out

    @torch.no_grad()
    def _run(self, inputs: Sequence[torch.Tensor], n: int) -> Any:
        with self._call_lock:
            return self._run_locked(inputs, n)

    def _run_locked(self, inputs: Sequence[torch.Tensor], n: int) -> Any:
        if not self._prepared:
            self.prepare()
        if self.device.type != "cuda":
            return self._call(inputs, n)
        with self.family.replay_on(torch.cuda.current_stream(self.device)):  # after the family's previous call
            return self._call(inputs, n)

    def _call(self, inputs: Sequence[torch.Tensor], n: int) -> Any:
        out = self._run_fn(self._stage(inputs))
        b = self.batch_size
        copy = self.copy_outputs and self.uses_graph

        def cut(t: torch.Tensor) -> torch.Tensor:
            if t.dim() >= 1 and t.shape[0] == b:
                t = t[:n] if n < b else t
            return t.clone() if copy else t

        return _tree_map(cut, out)

    def _run_fn(self, staged: Sequence[torch.Tensor]) -> Any:
        if self.mode == "eager":
            return self.fn(*staged)
        if self.mode == "compile":
            return self.compiled_fn(*staged)  # type: ignore[misc]
        if self._graph is not None:
            self._graph.replay()
            return self._static_out
        return self._call_inductor_graphs()  # compile+cudagraph through torch.compile's own graphs

    # -- callers that fill the static inputs themselves ----------------------------------------

    @property
    def prepared(self) -> bool:
        return self._prepared

    @property
    def graph_outputs(self) -> Any:
        """The manually captured graph's static outputs (what each replay rewrites), or None where
        this runner does not replay a graph of its own."""
        return self._static_out if self._graph is not None else None

    @contextlib.contextmanager
    def holding(self) -> Any:
        """This runner's call lock and its family's GPU order (as a call has them), for a caller that
        writes its batch straight into `static_inputs` and then calls `run_static` (a live render
        batch gathered by graphs of its own: engines/musetalk/batch_graphs.py)."""
        with self._call_lock:
            self._prepare_once()
            if self.device.type != "cuda":
                yield
                return
            with self.family.replay_on(torch.cuda.current_stream(self.device)):
                yield

    def run_static(self) -> Any:
        """`fn` on `static_inputs` as they are, under `holding`: every row of the bucket, outputs
        uncopied (in graph modes the static outputs, which the next call overwrites)."""
        with torch.no_grad():
            return self._run_fn(self.static_inputs)

    def _check(self, inputs: Sequence[torch.Tensor]) -> int:
        if len(inputs) != len(self.static_inputs):
            raise TypeError(f"expected {len(self.static_inputs)} inputs, got {len(inputs)}")
        ns = set()
        for i, (x, shape, dtype) in enumerate(zip(inputs, self._shapes, self._dtypes)):
            if not isinstance(x, torch.Tensor) or x.dim() < 1:
                raise TypeError(f"input {i}: expected a batched tensor, got {type(x).__name__}")
            if tuple(x.shape[1:]) != shape:
                raise ValueError(f"input {i}: per-item shape {tuple(x.shape[1:])} differs from the static {shape}")
            if x.dtype != dtype:
                raise TypeError(f"input {i}: dtype {x.dtype} differs from the static {dtype}")
            ns.add(x.shape[0])
        if len(ns) != 1:
            raise ValueError(f"inputs disagree on the batch size: {[tuple(x.shape) for x in inputs]}")
        n = ns.pop()
        if n < 1:
            raise ValueError("empty batch")
        return n

    def __call__(self, *inputs: torch.Tensor) -> Any:
        n = self._check(inputs)
        b = self.batch_size
        if n <= b:
            return self._run(inputs, n)
        parts, sizes = [], []
        for s in range(0, n, b):
            m = min(b, n - s)
            sizes.append(m)
            parts.append(self._run([x[s : s + m] for x in inputs], m))
            if self.uses_graph and not self.copy_outputs:  # views would be overwritten by the next chunk
                parts[-1] = _tree_map(lambda t: t.clone(), parts[-1])
        return _tree_cat(parts, sizes)

    def __repr__(self) -> str:
        extra = f", requested={self.requested_mode!r}" if self.mode != self.requested_mode else ""
        return f"StaticBatchRunner(batch_size={self.batch_size}, mode={self.mode!r}{extra}, device={self.device})"


# Render batches of live streams: a shared batch holds whatever the streams asked for meanwhile
# (often 8-16 frames), so sizes between the powers of two waste less padding (9 frames run as 12,
# not 16; 17 as 24, not 32) at the price of two more graphs.
RENDER_BUCKETS = (4, 8, 12, 16, 24, 32)
RENDER_BUCKETS_ENV = "NEWSSTUDIO_RENDER_BUCKETS"


def render_buckets() -> tuple[int, ...]:
    """The render batch buckets: ``RENDER_BUCKETS``, or the comma-separated sizes in
    ``$NEWSSTUDIO_RENDER_BUCKETS`` (e.g. ``4,8,16,32``: fewer graphs to capture, more padding)."""
    spec = os.environ.get(RENDER_BUCKETS_ENV, "").strip()
    if not spec:
        return RENDER_BUCKETS
    try:
        sizes = tuple(sorted({int(v) for v in spec.split(",") if v.strip()}))
    except ValueError:
        sizes = ()
    if not sizes or sizes[0] < 1:
        raise ValueError(f"${RENDER_BUCKETS_ENV}={spec!r} is not a comma-separated list of positive batch sizes")
    return sizes


STATIC_SHAPES = ("default", "none", "largest", "all")


def check_static_shapes(choice: str | None) -> str:
    """``choice`` as a `static_buckets` choice (None: "default"); raises ValueError naming the valid ones."""
    choice = "default" if choice is None else choice
    if choice not in STATIC_SHAPES:
        raise ValueError(f"static-shapes must be one of {', '.join(STATIC_SHAPES)}, got {choice!r}")
    return choice


def static_buckets(choice: str | None, buckets: Sequence[int], device_type: str, mode: str) -> tuple[int, ...]:
    """Which of ``buckets`` a `BucketedRunner` compiles at their own batch size (its ``static_sizes``):
    ``"none"``, ``"largest"`` (where throughput is made: full batches), ``"all"``, or ``"default"``/None:
    ``"largest"`` on CUDA with a compile mode (one compilation more than ``"none"``, ~65 s cold on
    an H100, cached after; the MuseTalk render of 32 frames 5 % faster there), else ``"none"``."""
    choice = check_static_shapes(choice)
    if choice == "default":
        choice = "largest" if compiled_on_cuda(device_type, mode) else "none"
    return {"none": (), "largest": (max(buckets),), "all": tuple(buckets)}[choice]


class BucketedRunner:
    """`fn` on power-of-two batch buckets (`min_bucket` .. `max_bucket`), or on the given `sizes`: one `StaticBatchRunner`
    per bucket, made on first use, so a call of n rows pays for the smallest bucket that holds n
    (a 5-frame tail of a stream runs as 8, not 32) and longer calls are split into `max_bucket`
    chunks. With a compile mode, ONE `torch.compile` of `fn` with a dynamic batch dimension
    serves every bucket (each bucket then only captures its CUDA graph), so a process compiles
    once; the buckets in ``static_sizes`` are compiled each for its own static shape instead (one
    more compilation each at warm-up; Inductor then plans for that size: the MuseTalk render of 32
    frames took 46.1 instead of 48.7 ms on an H100).
    Thread-safe: sessions share the runners; each graph replay copies its outputs out.
    """

    def __init__(self, fn: Callable[..., Any], mode: str, *, min_bucket: int = 4, max_bucket: int = 32,
                 sizes: Sequence[int] | None = None,
                 compile_mode: str = "default", fallback_on_error: bool = True, cache_dir: str | None = None,
                 backend: str | Callable[..., Any] = "inductor", allow_cpu_compile: bool = False,
                 tf32: bool = False, static_sizes: Sequence[int] = ()) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if sizes is not None:  # explicit bucket sizes instead of the powers of two
            sizes = sorted({int(b) for b in sizes})
            if not sizes or sizes[0] < 1:
                raise ValueError(f"bucket sizes must be >= 1, got {sizes}")
        else:
            if not 1 <= min_bucket <= max_bucket:
                raise ValueError(f"need 1 <= min_bucket <= max_bucket, got {min_bucket}, {max_bucket}")
            sizes = [int(min_bucket)]
            while sizes[-1] * 2 < max_bucket:
                sizes.append(sizes[-1] * 2)
            if sizes[-1] != max_bucket:
                sizes.append(int(max_bucket))
        self.fn, self.mode = fn, mode
        self._sizes: list[int] = sizes
        self.min_bucket, self.max_bucket = sizes[0], sizes[-1]
        self.compile_mode, self.fallback_on_error, self.cache_dir = compile_mode, fallback_on_error, cache_dir
        self.backend, self.allow_cpu_compile = backend, allow_cpu_compile
        self.runners: dict[int, StaticBatchRunner] = {}
        self.family = GraphFamily()  # the buckets replay one at a time: one capture stream, one order
        self.tf32 = bool(tf32)
        unknown = sorted({int(b) for b in static_sizes} - set(sizes))
        if unknown:
            raise ValueError(f"static_sizes {unknown} are not among the buckets {sizes}")
        # buckets compiled at their own batch size; the others share one dynamic-batch compilation
        self.static_sizes = frozenset(int(b) for b in static_sizes)
        self._compiled: Callable[..., Any] | None = None
        self._lock = threading.Lock()

    def bucket_for(self, n: int) -> int:
        return next(b for b in self._sizes if b >= min(n, self.max_bucket))

    def _shared_compiled(self, bucket: int) -> Callable[..., Any] | None:
        if self.mode not in COMPILE_MODES or bucket in self.static_sizes:
            return None
        if self._compiled is None:
            if self.backend == "inductor":
                configure_compile_cache(self.cache_dir)
                self._compiled = torch.compile(self.fn, mode=self.compile_mode, dynamic=None)
            else:  # another backend (tests): Inductor's modes do not apply
                self._compiled = torch.compile(self.fn, backend=self.backend, dynamic=None)
        return self._compiled

    def runner(self, n: int, example_inputs: Sequence[torch.Tensor]) -> StaticBatchRunner:
        bucket = self.bucket_for(n)
        with self._lock:
            r = self.runners.get(bucket)
            if r is None:
                r = StaticBatchRunner(self.fn, bucket, [x[:1] for x in example_inputs], mode=self.mode,
                                      compile_mode=self.compile_mode, backend=self.backend,
                                      fallback_on_error=self.fallback_on_error, compiled=self._shared_compiled(bucket),
                                      cache_dir=self.cache_dir, allow_cpu_compile=self.allow_cpu_compile,
                                      family=self.family, tf32=self.tf32)
                self.runners[bucket] = r
        return r

    def __call__(self, *inputs: torch.Tensor) -> Any:
        if self.mode == "eager":
            return self.fn(*inputs)
        return self.runner(int(inputs[0].shape[0]), inputs)(*inputs)

    def buckets(self) -> list[int]:
        """Every bucket size, smallest first."""
        return list(self._sizes)

    def padded_sizes(self) -> tuple[int, ...] | None:
        """The sizes a call is padded up to (its buckets); None in eager mode, which runs a call as it is."""
        return None if self.mode == "eager" else tuple(self._sizes)

    def warm_up(self, example_inputs: Sequence[torch.Tensor]) -> float:
        """Prepare (compile once, capture each graph) every bucket from one example row per input;
        returns the seconds spent. A no-op in eager mode."""
        if self.mode == "eager":
            return 0.0
        t0 = time.perf_counter()
        for b in self.buckets():
            self.runner(b, example_inputs).prepare()
        return time.perf_counter() - t0

    def release(self) -> None:
        """Drop every bucket's runner with its captured graph (their GPU memory pools go once
        collected) and the compiled callable; the next call prepares (captures) again, Dynamo's
        code cache of ``fn`` staying the process's. For benchmarks timing several engine
        configurations in one process: three Ditto variants' pools overflowed an 80 GB H100."""
        with self._lock:
            self.runners = {}
            self.family = GraphFamily()
            self._compiled = None

    @property
    def compile_seconds(self) -> float:
        """Seconds spent in first (compiling) calls, over all buckets."""
        return sum(r.compile_seconds or 0.0 for r in self.runners.values())

    def __repr__(self) -> str:
        return f"BucketedRunner(mode={self.mode!r}, buckets={sorted(self.runners)})"
