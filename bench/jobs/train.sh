# issue #36 ground truth (bench/gpu_train.py): bert / encoder / vit training recorded as written, with checkpointing,
# with SGD and at two micro-batches; real min budgets of each by bisection; the largest micro-batch under 3/4 of the
# program's own min budget; env: JOBS (8), DEADLINE (480 s), ONLY (comma list), BATCH_SIZES (only record at these
# batch sizes, no accumulation: plan's batch-size law); then: python bench/gpu_train.py score --truth DIR (on a CPU)
# limit: 540 s
python3 bench/gpu_train.py --out "$OUT" --jobs "${JOBS:-8}" --deadline "${DEADLINE:-480}" ${ONLY:+--only "$ONLY"} \
  ${BATCH_SIZES:+--batch-sizes "$BATCH_SIZES"} \
  >"$OUT/stdout.txt" 2>&1
grep -v '"kind": "recording"' "$OUT/stdout.txt" | tail -30
