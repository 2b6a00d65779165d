# forty-second session, call 6 (the budget's last ~140 s, a fresh host, so plain CUDA graphs: no compile): which MP4
# configuration suits stride mode, whose frames come by 0.47 s though its render alone needs ~0.16 s -- the ramped
# chunks (~8) vs whole 32-frame chunks, 12 vs 8 encoder workers. Relative figures only (plain graphs render slower).
source .carry/setup.sh
timeout ${L:-130} python -m benchmarks.ditto_bench --skip-reference --variants cudagraph --repeat 1 --stride 8 --stride-psnr-modes mask \
  --mp4 "ultrafast:12/8/1~8,ultrafast:12/8/1,ultrafast:8/8/1~8" --json $OUT/ditto_stride8_mp4.json > $OUT/ditto_stride8_mp4.log 2>&1
echo "rc $? at $SECONDS s"; grep -v WARNING $OUT/ditto_stride8_mp4.log | grep "fps\|MP4\|stride 8:" | tail -8
python - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/ditto_stride8_mp4.json")); d = d.get("ditto", d)
for name, fig in (("dense", d["ours"]), ("stride 8", d["stride"]["ours"])):
    for spec, s in fig["segment_mp4_s_by_config"].items():
        ph = fig["segment_mp4_phases_by_config"][spec]
        print(f"{name} {spec}: {s:.2f} s, chunks {ph['first_chunk_s']:.2f}-{ph['last_chunk_s']:.2f} s, alone {fig['segment_encode_alone_s_by_config'][spec]:.2f} s")
PY
