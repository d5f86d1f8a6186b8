# issues #36/#37 checks left by the last session (about 2.5 min): tune of the BERT fine-tune under 6 GiB (the
# checkpointing run now reaches the agent: does the named remedy really fit?), tune of the logits-keeping loop under
# 7.9 GiB (no setting fits: is the leak named?), a calibration run of the Faster R-CNN program at 2.35 GiB (explain's
# empty_cache remedy with learned fallbacks: tests/data/remedies_gpu det_cal_mid), the batch program against the
# micro-batched one at the sizes where plan and the real micro-batch differ (vit 42/43, encoder 21/22), and the
# trainer hooks' GPU test
# limit: 200 s
cr() { local tag=$1 cap=$2; shift 2
  python3 -m alloctune run --budget "${cap}B" --json -- python3 bench/train_programs.py "$@" >"$OUT/cap_$tag.json" 2>&1
  echo "$tag $(grep -o '"outcome": "[a-z]*"' "$OUT/cap_$tag.json" | head -1)" >>"$OUT/caps.txt"; }
tune_train bert6 6GiB 150 8 bert &
tune_train leak 7.9GiB 150 8 bert --keep-logits --steps 12 &
python3 -m alloctune run --budget 2.35GiB --record "$OUT/det_cal_mid.pickle" --json -- \
  python3 bench/cap_programs.py det >"$OUT/det_cal_mid.json" 2>&1 &
python3 -m pytest -q -rs -m gpu -p no:cacheprovider -o addopts="" tests/test_integrations.py >"$OUT/pytest.txt" 2>&1 &
for n in 42 43; do cr "vit_b$n" 4601056758 vit --batch "$n" & cr "vit_mb$n" 4601056758 vit --micro-batch "$n" & done
for n in 21 22; do cr "enc_b$n" 9004907451 encoder --batch "$n" & cr "enc_mb$n" 9004907451 encoder --micro-batch "$n" & done
wait
xz -T0 -6 "$OUT"/*.pickle 2>/dev/null
tail -4 "$OUT/pytest.txt"; sort "$OUT/caps.txt"
