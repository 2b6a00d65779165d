. .carry/setup.sh
set -o pipefail
export PATH=/tmp/site/bin:$PATH
date -u
# Ditto segment -> MP4: chunk sizes ramped 8 -> 32 -> 8 (~8) vs fixed 32 (run ZG: 0.77 s; first chunk in hand 0.12 s, encoder tail 0.22 s)
timeout 300 python3 -m benchmarks.ditto_bench --size 1080x1920 --skip-reference --variants compile+cudagraph --repeat 3 --chunk 32 --mp4 ultrafast:8/4/2,ultrafast:8/4/2~8,ultrafast:12/8/1~8,ultrafast:8/4/2~4,ultrafast:8/4/2~8 --json $OUT/ditto_ramp.json > $OUT/ditto_ramp.log 2>&1; echo rc=$?
grep -v "^WARNING: Ditto is using" $OUT/ditto_ramp.log | grep -i "mp4\|dense fps\|first frame\|load" | tail -9
date -u
date -u
