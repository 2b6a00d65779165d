. .carry/setup.sh
set -o pipefail
date -u
timeout 210 python3 .carry/probe_ttff.py compile+cudagraph 2>&1 | grep -v "^WARNING: Ditto is using" | tee $OUT/probe_ttff.log | tail -40
date -u
timeout 60 python3 -m benchmarks.encode_bench --size 1080x1920 --frames 165 --repeat 3 --configs ultrafast:16/16/4,ultrafast:16/8/4,ultrafast:16/4/4,ultrafast:16/8/2,ultrafast:8/8/2 --json $OUT/encode.json 2>&1 | tee $OUT/encode.log | tail -12
date -u
timeout 80 python3 -m benchmarks.conv_profile --engine ditto --rows 14 2>&1 | grep -v "^WARNING" | tee $OUT/conv_ditto.log | tail -34
date -u
timeout 200 python3 .carry/probe_ditto_ab.py 32 2>&1 | tee $OUT/probe_ab.log | tail -12
date -u
