. .carry/setup.sh
set -o pipefail
date -u
timeout 220 python3 .carry/probe_final.py 2>&1 | grep -v "^WARNING" | tee $OUT/probe_final.log | tail -30
date -u
