. .carry/setup.sh
set -o pipefail
date -u
# Ditto 6.6 s segment -> MP4 with smaller chunks (8 and 16 frames; run ZG used 32): do both ends shorten?
for c in 8 16; do
timeout 280 python3 -m benchmarks.ditto_bench --size 1080x1920 --skip-reference --variants compile+cudagraph --repeat 3 --chunk $c --mp4 ultrafast:8/4/2,ultrafast:12/8/1 --json $OUT/ditto_mp4c$c.json > $OUT/ditto_mp4c$c.log 2>&1; echo chunk=$c rc=$?
grep -v "^WARNING: Ditto is using" $OUT/ditto_mp4c$c.log | grep -i "mp4\|dense fps\|first frame" | tail -8
date -u
done
