# issue #15: `alloctune tune` of a 2-rank torchrun job (gloo, both ranks on cuda:0), per-rank recordings simulated
# rank by rank; env: LIMIT (240 s), LINES of the trial table shown (16)
# limit: 260 s
tune_ranks "$OUT/ranks_tune" "${LIMIT:-240}" "${LINES:-16}"
