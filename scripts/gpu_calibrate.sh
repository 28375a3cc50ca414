#!/usr/bin/env bash
# The one prepared device check (docs/validation.md, "On a GPU"): calibrate the device with a
# catalog model's shapes, then validate the simulator against the reference executor on it, for
# the calibration model and for a second model (the cross-model check). Everything lands in $OUT.
#
#   scripts/gpu_calibrate.sh                      # cuda: llama-3-8b shapes, validate llama-3-8b and mistral-7b
#   scripts/gpu_calibrate.sh --device cuda:1      # another GPU
#   scripts/gpu_calibrate.sh --device cpu --quick # dry run on a CPU (tiny-llama and tiny-llama-wide), ~2 min
#
# Budget on an H200: about 2 min of calibration and 2-3 min of validation per model. Exit status:
# 0 when both validations pass their tolerances, 1 when one does not, 2 on an error.
set -euo pipefail

DEVICE=cuda
QUICK=""
OUT="${OUT:-runs/gpu-calibration}"
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --quick) QUICK="--quick"; shift ;;
    --out) OUT="$2"; shift 2 ;;
    *) echo "usage: $0 [--device cuda|cuda:N|cpu] [--quick] [--out DIR]" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
batchsim() { "$PY" -m sim.cli "$@"; }

if [ "$DEVICE" = cpu ]; then
  MODEL=tiny-llama; OTHER=tiny-llama-wide; RATE=3
else
  MODEL=llama-3-8b; OTHER=mistral-7b; RATE=3
fi
mkdir -p "$OUT"

"$PY" - "$DEVICE" > "$OUT/environment.txt" <<'PYEOF'
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

echo "== calibrate $DEVICE with $MODEL's shapes"
batchsim calibrate --device "$DEVICE" $QUICK --model "$MODEL" \
  --out "$OUT/profile.yaml" 2>&1 | tee "$OUT/calibrate.log"

status=0
for m in "$MODEL" "$OTHER"; do
  echo "== validate $m on $DEVICE"
  batchsim validate --device "$DEVICE" --profile "$OUT/profile.yaml" --model "$m" --rate "$RATE" \
    --out "$OUT/validate-$m" 2>&1 | tee "$OUT/validate-$m.log" || status=1
done

echo "== results in $OUT: profile.yaml, calibrate.log, validate-*/validate.{json,csv,png}"
echo "   copy the profile to calibrate/profiles/ and the numbers into docs/validation.md"
exit $status
