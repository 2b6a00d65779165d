"""One line per level of a `benchmarks.load_test` JSON: what a results script prints after a run.

Why: the load test's JSON holds ~60 fields per level; these are the ones every live-stream table in
benchmarks/RESULTS.md quotes (on time, rates, the render thread's and the GIL's figures, where a
session's render call spends its time).

    python -m benchmarks.load_summary load_musetalk16.json [more.json ...]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def level_line(r: dict) -> str:
    """A level's figures in the order of the RESULTS tables."""
    def ms(key: str) -> str:
        v = r.get(key)
        return "-" if v is None else f"{v:.1f}"

    stride = ""
    if (r.get("ditto_stride") or 1) > 1:
        where = {True: ", rows on the host", False: ", rows on the device"}.get(r.get("stride_rows_on_host"), "")
        stride = f" | Ditto stride {r['ditto_stride']}{where}"
    return (f"{r['sessions']} sessions{stride} | batch graphs {r.get('batch_graphs')} | compose graphs {r.get('compose_graphs')} | socket writes {r.get('ws_socket_writes')} | "
            f"on time {r['sustained']} of {r['sessions']} | errors {r['errors']} | server fps {r['server_fps']:.1f} | "
            f"fps min {r['fps_min']:.1f} | jitter p95 {ms('jitter_p95_ms')} ms | batch {ms('batch_frames_mean')} frames "
            f"({r.get('requests_per_batch') or 0:.2f} requests) | render busy {r['render_busy_share']:.2f} | "
            f"GIL wait p50/p95 {r.get('gil_wait_p50_ms')}/{r.get('gil_wait_p95_ms')} ms | full GCs "
            f"{r.get('gc_full_collections', '-')}, longest {ms('gc_pause_max_ms')} ms | captures/compiles in level "
            f"{r.get('graph_captures_during', '-')}/{r.get('compiled_frames_during', '-')} | render call/wait/copy-out "
            f"{ms('session_render_call_ms')}/{ms('session_render_wait_ms')}/{ms('session_copy_out_ms')} ms | late max "
            f"{ms('late_max_ms')} ms | loop lag p95/max {ms('loop_lag_p95_ms')}/{ms('loop_lag_max_ms')} ms | GPU MB before/peak/after "
            f"{ms('gpu_before_mb')}/{ms('gpu_peak_mb')}/{ms('gpu_after_mb')}{host_part(r.get('host_speed'))}")


def host_part(host: dict | None) -> str:
    """The host's speed (benchmarks/host_speed.py), where the run recorded it."""
    if not host:
        return ""
    return f" | host: Python loop {host.get('python_loop_1m_ms')} ms, launch {host.get('cuda_launch_us')} us"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+", type=Path, help="load_test --json outputs")
    args = ap.parse_args(argv)
    for path in args.json:
        if not path.is_file():
            print(f"{path}: missing (the load test did not write it)")
            continue
        for r in json.loads(path.read_text()):
            print(level_line(r))


if __name__ == "__main__":
    main()
