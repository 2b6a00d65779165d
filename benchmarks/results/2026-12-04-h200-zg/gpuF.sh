. .carry/setup.sh
set -o pipefail
date -u
# Ditto 6.6 s segment -> MP4: when are the chunks in hand (render span under the encoders' load) vs the encoder's tail?
timeout 330 python3 -m benchmarks.ditto_bench --size 1080x1920 --skip-reference --variants compile+cudagraph --repeat 3 --mp4 ultrafast:8/8/2,ultrafast:8/4/2,ultrafast:12/8/1 --json $OUT/ditto_mp4p.json > $OUT/ditto_mp4p.log 2>&1; echo rc=$?
grep -v "^WARNING: Ditto is using" $OUT/ditto_mp4p.log | grep -i "mp4\|dense fps\|first frame" | tail -8
date -u
