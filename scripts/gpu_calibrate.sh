#!/usr/bin/env bash
# The one prepared device check (docs/validation.md, "On a GPU"): probe attention's host time and
# eager against CUDA-graph decode steps, run the executor's GPU tests (graph capture and replay
# equal to eager), calibrate the device with a catalog model's shapes, then validate the
# simulator against the reference executor on it, for the calibration model and for a second
# model (the cross-model check). The executor's pure-decode steps replay CUDA graphs (--graphs;
# on a CPU the dry run runs their static layout uncaptured). Everything lands in --out.
#
#   scripts/gpu_calibrate.sh                      # cuda: llama-3-8b shapes, validate llama-3-8b and mistral-7b
#   scripts/gpu_calibrate.sh --device cuda:1      # another GPU
#   scripts/gpu_calibrate.sh --device cpu --quick # dry run on a CPU (tiny-llama and tiny-llama-wide), ~2 min
#
# Options: --rounds N (timed calibration rounds; default 6 on a GPU, where CUDA events are steady),
# --step-repeats N (runs of each executed validation step; default 1 on a GPU, 3 on a CPU),
# --requests N (validation workload size, default 60),
# --pack FILE (after every phase, pack the output folder into FILE, a .tgz: a run cut short by a
# time limit keeps what it finished). Each phase has its own time limit, so one that overruns
# cannot take the others with it. Budget on an H200: under 1 min of probe, under 1 min of GPU
# tests, about 2 min of calibration and 1-2 min of validation per model: 5-7 min in all (give
# the device call 600 s and --pack). Exit status: 0 when every phase ran and both validations
# pass their tolerances, 1 when one does not or a phase failed, 2 on a usage error. Relative --out and
# --pack paths are taken from the repository root.
set -uo pipefail

DEVICE=cuda
QUICK=""
OUT="runs/gpu-calibration"
ROUNDS=""
STEP_REPEATS=""
PACK=""
REQUESTS=60
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --quick) QUICK="--quick"; shift ;;
    --out) OUT="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --step-repeats) STEP_REPEATS="$2"; shift 2 ;;
    --pack) PACK="$2"; shift 2 ;;
    --requests) REQUESTS="$2"; shift 2 ;;
    *) echo "usage: $0 [--device cuda|cuda:N|cpu] [--quick] [--out DIR] [--rounds N] [--step-repeats N] [--requests N] [--pack FILE.tgz]" >&2
       exit 2 ;;
  esac
done

cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || command -v "$PY" >/dev/null || PY=python3
export PYTHONUNBUFFERED=1

if [ "$DEVICE" = cpu ]; then
  MODEL=tiny-llama; OTHER=tiny-llama-wide; RATE=3
  ROUNDS="${ROUNDS:-}"; STEP_REPEATS="${STEP_REPEATS:-3}"
  LIMIT_CAL=900; LIMIT_VAL=900; LIMIT_PROBE=300; LIMIT_TEST=300; PROBE_STEPS=4
else
  MODEL=llama-3-8b; OTHER=mistral-7b; RATE=3
  ROUNDS="${ROUNDS:-6}"; STEP_REPEATS="${STEP_REPEATS:-1}"
  LIMIT_CAL="${LIMIT_CAL:-240}"; LIMIT_VAL="${LIMIT_VAL:-180}"; LIMIT_PROBE=90; LIMIT_TEST=90; PROBE_STEPS=12
fi
mkdir -p "$OUT"
T0=$(date +%s)
pack() {
  echo "== $(( $(date +%s) - T0 )) s: $1"
  if [ -n "$PACK" ]; then tar czf "$PACK.part" -C "$OUT" . && mv "$PACK.part" "$PACK"; fi
}

if [ "$DEVICE" != cpu ] && command -v nvidia-smi >/dev/null; then
  # clocks, load and power every 250 ms: a step-time anomaly can be matched to the device's state
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,utilization.gpu,power.draw,temperature.gpu \
    --format=csv -lms 250 > "$OUT/nvidia-smi.csv" 2>&1 &
  SMI=$!
  trap 'kill $SMI 2>/dev/null' EXIT
fi

"$PY" - "$DEVICE" > "$OUT/environment.txt" 2>&1 <<'PYEOF'
import platform, subprocess, sys
import torch
dev = sys.argv[1]
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
if dev.startswith("cuda"):
    print(torch.cuda.get_device_name(torch.device(dev)))
    try:
        print(subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout)
    except OSError:
        pass
else:
    print(platform.processor() or platform.machine(), "threads", torch.get_num_threads())
PYEOF
cat "$OUT/environment.txt" | head -3
pack "environment recorded"

status=0
# attention host time per shape, cuDNN SDPA allowed and not; then eager against graph decode steps
# (wall and host enqueue time, tokens agreeing): see the script's docstring
echo "== probe: attention host time, eager against graph decode steps"
timeout "$LIMIT_PROBE" "$PY" scripts/sdpa_probe.py --device "$DEVICE" --steps "$PROBE_STEPS" \
  --json "$OUT/graph_probe.json" 2>&1 | tee "$OUT/sdpa_probe.txt"
p=${PIPESTATUS[0]}
[ "$p" = 0 ] || status=1
pack "probe exited $p"

# capture and replay equal eager steps (tokens, logits, KV written by the graphs); skipped without CUDA
echo "== executor graph tests"
if "$PY" -m pytest --version >/dev/null 2>&1; then
  timeout "$LIMIT_TEST" "$PY" -m pytest -q -p no:cacheprovider -m gpu -rs tests/test_executor_graphs.py 2>&1 \
    | tee "$OUT/gpu_tests.log"
  t=${PIPESTATUS[0]}
  [ "$t" = 0 ] || status=1
  pack "graph tests exited $t"
else
  echo "pytest is not installed for $PY: graph tests not run" | tee "$OUT/gpu_tests.log"
fi

echo "== calibrate $DEVICE with $MODEL's shapes (${ROUNDS:-default} rounds)"
timeout "$LIMIT_CAL" "$PY" -m batchsim.app.cli calibrate --device "$DEVICE" $QUICK --model "$MODEL" --graphs \
  ${ROUNDS:+--rounds "$ROUNDS"} --evidence "$OUT/calibration" --out "$OUT/profile.yaml" 2>&1 | tee "$OUT/calibrate.log"
cal=${PIPESTATUS[0]}
pack "calibration exited $cal"
[ "$cal" = 0 ] || { echo "calibration failed ($cal)"; exit 1; }

for m in "$MODEL" "$OTHER"; do
  echo "== validate $m on $DEVICE"
  timeout "$LIMIT_VAL" "$PY" -m batchsim.app.cli validate --device "$DEVICE" --profile "$OUT/profile.yaml" --model "$m" \
    --graphs --rate "$RATE" --requests "$REQUESTS" --step-repeats "$STEP_REPEATS" --out "$OUT/validate-$m" 2>&1 \
    | tee "$OUT/validate-$m.log"
  v=${PIPESTATUS[0]}
  [ "$v" = 0 ] || status=1
  pack "validation of $m exited $v"
done

# how the steps ran: every timed step's mode (eager / static / capture / graph) and its median host
# enqueue against wall time, per mode, from the recorded step times
"$PY" - "$OUT" <<'PYEOF' 2>&1 | tee "$OUT/graph_summary.txt"
import json, pathlib, statistics, sys
import pandas as pd
out = pathlib.Path(sys.argv[1])
facts = out / "calibration" / "facts.json"
if facts.is_file():
    print("calibration whole steps:", json.loads(facts.read_text()).get("graphs"))
for v in sorted(out.glob("validate-*/validate.json")):
    meta = json.loads(v.read_text())["meta"]
    print(v.parent.name, meta.get("executor_steps"))
    for f in sorted(v.parent.glob("*/executor_step_times.csv")):
        df = pd.read_csv(f)
        for mode, g in df.groupby("mode"):
            print(f"  {f.parent.name:16s} {mode:8s} {len(g):5d} steps: median wall {g.wall_s.median() * 1e3:7.2f} ms, "
                  f"enqueue {g.enqueue_s.median() * 1e3:7.2f} ms, predicted/measured - 1 "
                  f"{statistics.median(g.predicted_s / g.measured_s - 1):+.1%}")
PYEOF
pack "summary written"

echo "== results in $OUT: profile.yaml, calibration/, calibrate.log, validate-*/validate.{json,csv,png}, graph_probe.json, graph_summary.txt"
echo "   copy the profile to batchsim/calibrate/profiles/ and the numbers into docs/validation.md"
exit $status
