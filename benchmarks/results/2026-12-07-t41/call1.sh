# forty-first session, call 1: the CUDA tests the fortieth could not run; Ditto stride 4 with the compiled defaults
source .carry/setup.sh
python -m benchmarks.host_speed 2>&1 | tail -2
timeout 150 python -m pytest -q -p no:cacheprovider tests/test_batching.py tests/test_ditto_engine.py -k "stream_of_its_own or own_cuda_stream" 2>&1 | tail -8
timeout 420 python -m benchmarks.ditto_bench --skip-reference --variants compile+cudagraph --stride 4 --stride-psnr-modes mask --json $OUT/ditto_stride4.json > $OUT/ditto_stride4.log 2>&1
echo "rc $?"; grep -v WARNING $OUT/ditto_stride4.log | tail -30
