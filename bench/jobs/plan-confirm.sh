# issue #28 item 4: `plan --confirm` of the plan-sharp recordings (bench/gpu_plan_sharp.py confirm) (env PLAN_DATA: that job's folder, CASES:
# workload:c1|c2:default|expandable,...), against the real largest sizes it bisected
# limit: 420 s
python3 bench/gpu_plan_sharp.py confirm --data "${PLAN_DATA:?PLAN_DATA: the plan-sharp folder}" --out "$OUT" \
  ${CASES:+--cases "$CASES"}
