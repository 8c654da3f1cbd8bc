#!/usr/bin/env bash
# The GPU checks, run once on a CUDA machine from the repository root (its python3 holding torch with CUDA and the
# project's dependencies). Logs and JSON go to $OUT (default benchmarks/results).
#
#   bash benchmarks/gpu_check.sh tests   # exactness on CUDA in fp32: tiny Llama and Qwen2 with every draft source
#                                        # and engine (eager, CUDA graphs, transformers); the default model if installed
#   bash benchmarks/gpu_check.sh bench   # bench_rest in fp32 and bf16 (CUDA graphs vs eager step vs transformers'
#                                        # generate and prompt lookup), and how often bf16 changes the output
#   bash benchmarks/gpu_check.sh all
#   bash benchmarks/gpu_check.sh tests -k "not default_model"   # arguments after the phase go to pytest
#
# MODEL=/path/to/model.gguf picks the model of the benchmarks (default: the default model).
set -uo pipefail
out=${OUT:-benchmarks/results}
mkdir -p "$out" benchmarks/results
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
model=()
[ -n "${MODEL:-}" ] && model=(--model "$MODEL")
phase=${1:-all}
shift $(( $# > 0 ? 1 : 0 ))

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $py -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'transformers', transformers.__version__, 'device', torch.cuda.get_device_name())"
} 2>&1 | tee -a "$out/gpu.txt"

if [ "$phase" = tests ] || [ "$phase" = all ]; then
  start=$(date +%s)
  REST_LSP_TEST_DEVICE=cuda $py -m pytest -q -p no:cacheprovider -o addopts="" \
    tests/engine/test_exactness.py tests/engine/test_static_step.py "$@" 2>&1 | tee "$out/tests-cuda.log" | tail -25
  echo "tests: $(( $(date +%s) - start )) s"
fi

if [ "$phase" = bench ] || [ "$phase" = all ]; then
  for dtype in float32 bfloat16; do
    start=$(date +%s)
    $py benchmarks/bench_rest.py --device cuda --dtype $dtype --prompts ${PROMPTS:-6} --eager-engine --useless \
      "${model[@]}" --out "rest-cuda-$dtype" 2>&1 | tee "$out/bench-cuda-$dtype.log" | grep -v '^  '
    cp "benchmarks/results/rest-cuda-$dtype.json" "$out/" 2>/dev/null
    echo "bench_rest $dtype: $(( $(date +%s) - start )) s"
  done
  start=$(date +%s)
  $py benchmarks/bench_bf16.py --device cuda --prompts 10 "${model[@]}" 2>&1 | tee "$out/bf16-cuda.log" | tail -9
  cp benchmarks/results/bf16.json "$out/bf16-cuda.json" 2>/dev/null
  echo "bench_bf16: $(( $(date +%s) - start )) s"
fi
