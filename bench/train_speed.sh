#!/usr/bin/env bash
# The project's training-speed benchmark: meshtrain against the PyTorch reference (bench/torch_gpt.py)
# on the same GPT, batch and sequence length, on this machine's CPU cores.
#
#   bench/train_speed.sh [--data FILE] [--reps N] [--quick] [--no-gemm] [MODEL ...]
#
# MODEL: gpt-tiny gpt-small gpt2-124m (default: all three). For each model the two programs run
# alternately, meshtrain then PyTorch, --reps times (default 2: A B A B, so slow drift of the
# machine hits both alike); each run skips its first WARMUP steps and reports tokens/s = B*T over the
# median step time; the table shows the mean over the reps. PyTorch runs at its best thread setting
# on a 2-core machine (docs/benchmarks.md, "Training speed"); TORCH_THREADS="INTRA,BLAS" overrides.
# If build/meshtrain is missing or fails, the meshtrain column says so and PyTorch still runs.
# If bench_gemm was built, its square SGEMM case runs first (optional; --no-gemm skips it).
# Default data: data/corpus.txt if present, else ../shared/data/tinyshakespeare.txt.
# The default run takes about 4-6 minutes on 2 idle cores; --quick takes about a third of that.
set -uo pipefail
cd "$(dirname "$0")/.."

MESHTRAIN=${MESHTRAIN:-build/meshtrain}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}   # seconds per single run
WARMUP=3
REPS=2
DATA=""
GEMM=1
QUICK=0
MODELS=()

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --data) DATA=${2:?--data needs a file}; shift 2 ;;
    --data=*) DATA=${1#--data=}; shift ;;
    --reps) REPS=${2:?--reps needs a number}; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --no-gemm) GEMM=0; shift ;;
    -h|--help) usage; exit 0 ;;
    gpt-tiny|gpt-small|gpt2-124m) MODELS+=("$1"); shift ;;
    *) echo "train_speed.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[ ${#MODELS[@]} -gt 0 ] || MODELS=(gpt-tiny gpt-small gpt2-124m)
case "$REPS" in ''|*[!0-9]*|0) echo "train_speed.sh: --reps must be a positive integer" >&2; exit 2 ;; esac

if [ -z "$DATA" ]; then
  for f in data/corpus.txt ../shared/data/tinyshakespeare.txt; do
    if [ -s "$f" ]; then DATA=$f; break; fi
  done
  [ -n "$DATA" ] || { echo "train_speed.sh: no data/corpus.txt (run scripts/setup.sh) nor ../shared/data/tinyshakespeare.txt; pass --data FILE" >&2; exit 2; }
fi
[ -s "$DATA" ] || { echo "train_speed.sh: --data $DATA: no such file" >&2; exit 2; }

# Per model: batch, sequence length, timed steps (full run, --quick), target ratio meshtrain/PyTorch,
# PyTorch's best threads "intra-op,OpenBLAS" on 2 cores (sweep in docs/benchmarks.md).
declare -A BATCH=([gpt-tiny]=12 [gpt-small]=8 [gpt2-124m]=4)
declare -A SEQ=([gpt-tiny]=64 [gpt-small]=256 [gpt2-124m]=64)
declare -A STEPS=([gpt-tiny]=40 [gpt-small]=15 [gpt2-124m]=10)
declare -A QSTEPS=([gpt-tiny]=15 [gpt-small]=5 [gpt2-124m]=4)
declare -A TARGET=([gpt-tiny]=2.0 [gpt-small]=1.4 [gpt2-124m]=1.5)
declare -A BEST_THREADS=([gpt-tiny]=1,1 [gpt-small]=1,2 [gpt2-124m]=1,2)

PY=python3
command -v "$PY" > /dev/null || PY=/usr/bin/python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "== training speed: $(date -u '+%Y-%m-%d %H:%M UTC'), $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p'), $(nproc) cores"
echo "   data $DATA, warm-up $WARMUP steps, $REPS rep(s) alternating meshtrain/PyTorch; load:$(uptime | sed 's/.*load average://')"
load1=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load1" 'BEGIN { exit !(l > 0.5) }'; then
  echo "   warning: the machine is busy (1-min load $load1): figures will be low and noisy"
fi

# Optional: the 2-thread SGEMM rate of meshtrain's own GEMM benchmark, square case.
if [ "$GEMM" = 1 ]; then
  gemm=""
  for f in build/bench/bench_gemm build/bench_gemm build/bench/gemm; do
    [ -x "$f" ] && { gemm=$f; break; }
  done
  if [ -n "$gemm" ]; then
    echo "== SGEMM, square case ($gemm, 2 threads)"
    OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2 timeout "$RUN_TIMEOUT" "$gemm" \
      --benchmark_filter='[Ss][Qq][Uu][Aa][Rr][Ee]' 2>&1 | sed 's/^/   /' \
      || echo "   (bench_gemm failed or has no square case)"
  else
    echo "== SGEMM: skipped (no build/bench/bench_gemm; build with Google Benchmark installed)"
  fi
fi

have_meshtrain=1
if [ ! -x "$MESHTRAIN" ]; then
  have_meshtrain=0
  echo "== meshtrain: $MESHTRAIN not found (build it with scripts/build.sh): PyTorch column only"
fi

# Summarises a meshtrain metrics file: skips the first WARMUP step lines, prints
# "tokens_per_s median_step_ms first_loss last_loss steps" (tokens/s = B*T / median step_ms).
summarise_metrics() {
  "$PY" - "$1" "$2" "$WARMUP" <<'EOF'
import json, statistics, sys
path, bt, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = []
for line in open(path):
    line = line.strip()
    if not line.startswith("{"):
        continue
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if "step" in r and ("step_ms" in r or "tokens_per_s" in r):
        rows.append(r)
timed = rows[warm:]
if not timed:
    sys.exit(1)
if all("step_ms" in r for r in timed):
    med = statistics.median(float(r["step_ms"]) for r in timed)
    tps = bt / (med / 1e3)
else:
    tps = statistics.median(float(r["tokens_per_s"]) for r in timed)
    med = bt / tps * 1e3
print(f"{tps:.1f} {med:.2f} {rows[0].get('loss', 'nan')} {rows[-1].get('loss', 'nan')} {len(timed)}")
EOF
}

declare -A MT_TPS PT_TPS MT_NOTE PT_NOTE
for m in "${MODELS[@]}"; do
  B=${BATCH[$m]} T=${SEQ[$m]}
  S=${STEPS[$m]}
  [ "$QUICK" = 1 ] && S=${QSTEPS[$m]}
  th=${TORCH_THREADS:-${BEST_THREADS[$m]}}
  intra=${th%,*} blas=${th#*,}
  echo "== $m: B=$B T=$T, $S timed steps after $WARMUP warm-up; PyTorch intra-op $intra, OpenBLAS $blas"
  mt_vals=() pt_vals=()
  for ((r = 1; r <= REPS; r++)); do
    if [ "$have_meshtrain" = 1 ]; then
      mf="$TMP/$m.$r.jsonl"
      rm -f "$mf"
      timeout "$RUN_TIMEOUT" "$MESHTRAIN" train --model "$m" --data "$DATA" --steps $((S + WARMUP)) \
        --batch "$B" --seq "$T" --metrics "$mf" > "$TMP/$m.$r.log" 2>&1
      rc=$?
      if [ "$rc" = 0 ] && [ -s "$mf" ] && sum=$(summarise_metrics "$mf" $((B * T))); then
        read -r tps med l0 l1 n <<< "$sum"
        echo "   rep $r meshtrain: $tps tokens/s (median $med ms/step over $n steps; loss $l0 -> $l1)"
        mt_vals+=("$tps")
      else
        echo "   rep $r meshtrain: FAILED (exit $rc${rc:+, }metrics $( [ -s "$mf" ] && echo unreadable || echo missing)); its last lines:"
        tail -n 5 "$TMP/$m.$r.log" | sed 's/^/      /'
        MT_NOTE[$m]="failed"
      fi
    fi
    if out=$(timeout "$RUN_TIMEOUT" "$PY" bench/torch_gpt.py --model "$m" --data "$DATA" --batch "$B" \
               --seq "$T" --steps "$S" --warmup "$WARMUP" --intra-threads "$intra" --blas-threads "$blas" \
               --json --quiet 2> "$TMP/$m.$r.torch.err"); then
      read -r tps med l0 l1 <<< "$("$PY" -c 'import json,sys; r=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(r["tokens_per_s"], r["step_ms"]["median"], r["loss"]["first"], r["loss"]["last"])' <<< "$out")"
      echo "   rep $r PyTorch:   $tps tokens/s (median $med ms/step; loss $l0 -> $l1)"
      pt_vals+=("$tps")
    else
      rc=$?
      if [ "$rc" = 2 ] && grep -q "not installed" "$TMP/$m.$r.torch.err"; then
        PT_NOTE[$m]="no torch"
        echo "   PyTorch: not installed (apt-get install -y python3-torch python3-numpy)"
        break
      fi
      echo "   rep $r PyTorch: FAILED (exit $rc)"; tail -n 5 "$TMP/$m.$r.torch.err" | sed 's/^/      /'
      PT_NOTE[$m]="failed"
    fi
  done
  mean() { [ $# -gt 0 ] && printf '%s\n' "$@" | awk '{ s += $1 } END { printf "%.0f", s / NR }'; }
  MT_TPS[$m]=$(mean "${mt_vals[@]}")
  PT_TPS[$m]=$(mean "${pt_vals[@]}")
done

echo
printf '%-10s %16s %16s %7s %7s  %s\n' model "meshtrain tok/s" "PyTorch tok/s" ratio target verdict
for m in "${MODELS[@]}"; do
  mt=${MT_TPS[$m]:-} pt=${PT_TPS[$m]:-}
  [ -n "$mt" ] || { [ "$have_meshtrain" = 1 ] && mt=${MT_NOTE[$m]:-failed} || mt="not built"; }
  [ -n "$pt" ] || pt=${PT_NOTE[$m]:-failed}
  ratio="-" verdict=""
  if [[ "$mt" =~ ^[0-9]+$ && "$pt" =~ ^[0-9]+$ && "$pt" -gt 0 ]]; then
    ratio=$(awk -v a="$mt" -v b="$pt" 'BEGIN { printf "%.2f", a / b }')
    verdict=$(awk -v r="$ratio" -v t="${TARGET[$m]}" 'BEGIN { print (r >= t ? "meets target" : "below target") }')
  fi
  printf '%-10s %16s %16s %7s %7s  %s\n' "$m" "$mt" "$pt" "$ratio" "${TARGET[$m]}" "$verdict"
done
echo "(tokens/s = batch*seq / median step time, mean over $REPS rep(s); load at end:$(uptime | sed 's/.*load average://'))"
