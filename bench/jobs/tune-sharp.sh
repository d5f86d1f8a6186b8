# issue #28: tune of four real models (HuBERT, Llama generate, DeepLabV3, ConvNeXt) under budgets where the default
# fails (bench/gpu_tune.py real --budgets sharp), one at a time: runs and wall time against one run; env ONLY,
# TRIAL_TIMEOUT (150), THROUGHPUT (measure: the tunes' --throughput measure)
# limit: 480 s
mkdir -p "$OUT/tune"
python3 bench/gpu_tune.py real --out "$OUT/tune" --jobs 1 --timeout "${TRIAL_TIMEOUT:-150}" --budgets sharp \
  --only "${ONLY:-hubert,llama,seg,convnext,hubert_grad}" ${THROUGHPUT:+--throughput "$THROUGHPUT"} >"$OUT/tune/stdout.txt" 2>&1
cat "$OUT/tune/summary.md"
