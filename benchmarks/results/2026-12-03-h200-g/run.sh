. .carry/setup.sh
set -o pipefail
date -u
timeout 250 python3 .carry/probe_buckets.py 2>&1 | grep -v "^WARNING" | tee $OUT/probe_buckets.log | tail -30
date -u
timeout 260 python3 .carry/probe_gemm.py 2>&1 | grep -v "^WARNING" | tee $OUT/probe_gemm.log | tail -12
date -u
