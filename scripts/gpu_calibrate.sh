#!/usr/bin/env bash
# The one prepared device check (docs/validation.md, "On a GPU"): calibrate the device with a
# catalog model's shapes, then validate the simulator against the reference executor on it, for
# the calibration model and for a second model (the cross-model check). Everything lands in --out.
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
# cannot take the others with it. Budget on an H200: about 2 min of calibration and 1-2 min of
# validation per model. Exit status: 0 when both validations pass their tolerances, 1 when one
# does not or a phase failed, 2 on a usage error. Relative --out and --pack paths are taken
# from the repository root.
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
  LIMIT_CAL=900; LIMIT_VAL=900
else
  MODEL=llama-3-8b; OTHER=mistral-7b; RATE=3
  ROUNDS="${ROUNDS:-6}"; STEP_REPEATS="${STEP_REPEATS:-1}"
  LIMIT_CAL="${LIMIT_CAL:-240}"; LIMIT_VAL="${LIMIT_VAL:-180}"
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

if [ "$DEVICE" != cpu ]; then
  # attention host time per shape, cuDNN SDPA allowed and not (see the script's docstring)
  timeout 90 "$PY" scripts/sdpa_probe.py --device "$DEVICE" 2>&1 | tee "$OUT/sdpa_probe.txt"
  pack "attention probe"
fi

echo "== calibrate $DEVICE with $MODEL's shapes (${ROUNDS:-default} rounds)"
timeout "$LIMIT_CAL" "$PY" -m batchsim.app.cli calibrate --device "$DEVICE" $QUICK --model "$MODEL" \
  ${ROUNDS:+--rounds "$ROUNDS"} --evidence "$OUT/calibration" --out "$OUT/profile.yaml" 2>&1 | tee "$OUT/calibrate.log"
cal=${PIPESTATUS[0]}
pack "calibration exited $cal"
[ "$cal" = 0 ] || { echo "calibration failed ($cal)"; exit 1; }

status=0
for m in "$MODEL" "$OTHER"; do
  echo "== validate $m on $DEVICE"
  timeout "$LIMIT_VAL" "$PY" -m batchsim.app.cli validate --device "$DEVICE" --profile "$OUT/profile.yaml" --model "$m" \
    --rate "$RATE" --requests "$REQUESTS" --step-repeats "$STEP_REPEATS" --out "$OUT/validate-$m" 2>&1 | tee "$OUT/validate-$m.log"
  v=${PIPESTATUS[0]}
  [ "$v" = 0 ] || status=1
  pack "validation of $m exited $v"
done

echo "== results in $OUT: profile.yaml, calibration/, calibrate.log, validate-*/validate.{json,csv,png}"
echo "   copy the profile to batchsim/calibrate/profiles/ and the numbers into docs/validation.md"
exit $status
