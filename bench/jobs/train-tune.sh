# issue #36 end to end: `alloctune tune` of the BERT fine-tune under 6 GiB (no setting fits; the checkpointing run
# confirms), of the logits-keeping loop under 8.3 GiB (the leak named), and `run --checkpointing --record` of bert /
# encoder / vit (the agent's switch, against the hand-written min budgets in tests/data/train_gpu)
# limit: 330 s
for m in bert encoder vit; do
  python3 -m alloctune run --checkpointing --record "$OUT/agentckpt_$m.pickle" --json -- \
    python3 bench/train_programs.py "$m" --facts "$OUT/agentckpt_$m.facts.json" >"$OUT/agentckpt_$m.json" \
    2>"$OUT/agentckpt_$m.stderr" && xz -T0 -6 "$OUT/agentckpt_$m.pickle" &
done
tune_train bert6 6GiB 280 25 bert &
tune_train leak 8.3GiB 280 25 bert --keep-logits --steps 12 &
wait
for m in bert encoder vit; do echo "agentckpt $m:"; head -c 600 "$OUT/agentckpt_$m.json"; echo; done
