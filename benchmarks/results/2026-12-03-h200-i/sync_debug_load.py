"""Run benchmarks.load_test with CUDA sync debugging: each synchronising call site printed once, with its stack."""
import runpy, sys, threading, traceback, warnings
import torch

torch.cuda.set_sync_debug_mode(1)
_seen = set()
_lock = threading.Lock()

def _show(message, category, filename, lineno, file=None, line=None):
    if "synchroniz" not in str(message):
        return
    stack = traceback.extract_stack()[:-2]
    key = tuple((f.filename, f.lineno) for f in stack[-4:])
    with _lock:
        if key in _seen:
            return
        _seen.add(key)
        print(f"SYNC [{threading.current_thread().name}] {message}\n" + "".join(traceback.format_list(stack[-8:])), file=sys.stderr, flush=True)

warnings.showwarning = _show
warnings.simplefilter("always")
sys.argv = ["benchmarks.load_test"] + sys.argv[1:]
runpy.run_module("benchmarks.load_test", run_name="__main__")
