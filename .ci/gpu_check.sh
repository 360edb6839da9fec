#!/bin/bash
# The GPU checks, on a GPU machine, from the repository root, after
# `make gpu-bundle` here (its .whl and .dev travel with the tree): the Go
# CUDA tests, tests/python/test_cuda.py and benchmarks/bench_gpu.py --quick
# (with a profile of each hand-off consumer, profile.txt).
# Each step has a deadline that leaves the others their time (8 minutes
# at most: run it with a limit of 540 s); logs go to $OUT (or
# /tmp/zctipc-gpu-logs).
OUT=${OUT:-/tmp/zctipc-gpu-logs}
mkdir -p "$OUT"
ROOT=$(pwd)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/zctipc-site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/zctipc-site PYTHONUNBUFFERED=1
python3 -c "import torch, zctipc.cuda as c; print('torch', torch.__version__, 'cuda', c.is_available(), c.unavailable_reason())"
status=0
for p in cuda cudaalloc; do
	echo "== go test ./go/internal/$p"
	(cd "go/internal/$p" && timeout -k 5 90 "$ROOT/.dev/$p.test" -test.v -test.count=1 >"$OUT/go-$p.log" 2>&1) || status=1
	grep -E "^(--- |FAIL|PASS$|panic)" "$OUT/go-$p.log"
done
echo "== tests/python/test_cuda.py"
timeout -k 5 240 python3 -m pytest -v -rfE -p no:cacheprovider --timeout=60 tests/python/test_cuda.py >"$OUT/pytest.log" 2>&1 || status=1
grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/pytest.log" | grep -v "^tests.*PASSED"
echo "== benchmarks/bench_gpu.py --quick"
timeout -k 5 200 python3 benchmarks/bench_gpu.py --quick --json "$OUT/bench_gpu.json" --profile "$OUT/profile.txt" >"$OUT/bench.log" 2>&1 || status=1
sed -n '/^GPU hand-off/,$p' "$OUT/bench.log"
exit $status
