# forty-third session, call 2: live Ditto sessions in stride mode (k = 4), a 30 s level of S (default 12) sessions with
# the rows handed over on the host (default) and again with NEWSSTUDIO_STRIDE_ROWS=device (each render reads them back)
source .carry/setup.sh; set -o pipefail; export PATH=/tmp/site/bin:$PATH
for ROWS in ${ROWS:-host device}; do
  NEWSSTUDIO_STRIDE_ROWS=$ROWS timeout -s ABRT ${L:-250} python -X faulthandler -m benchmarks.load_test --engine ditto --fps 30 \
    --weights random --size 1080 --accel compile+cudagraph --client-processes 4 --render-aheads 8 --render-leads 0.15 \
    --send-on-clock on --warm-up-s 5 --duration 30 --sessions ${S:-12} --ditto-stride ${K:-4} \
    --json $OUT/load_stride_$ROWS.json > $OUT/load_stride_$ROWS.log 2>&1; echo "$ROWS rows: rc $? at $SECONDS s"
  grep "ready after\|level of" $OUT/load_stride_$ROWS.log; python -m benchmarks.load_summary $OUT/load_stride_$ROWS.json
done
