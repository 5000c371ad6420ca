#!/usr/bin/env bash
# Tensor-parallel step time on this machine's 2 cores: meshtrain --tp 2 against --tp 1, and the
# PyTorch peer (bench/torch_tp.py, Megatron-LM-style TP over gloo) at tp 2 against tp 1, in one run.
#
#   bench/tp_speed.sh [--reps N] [--steps N] [--data FILE] [--model NAME] [--batch B] [--seq T]
#
# Default: gpt-small at B=8 T=256 (its named batch and context), 8 steps of which WARMUP=2 are
# untimed. Per rep the runs alternate between the two programs (order reversed on even reps):
#   meshtrain --tp 1 --threads 2 | PyTorch tp 1, intra-op 1 + OpenBLAS 2 |
#   meshtrain --tp 2 --threads 1 | PyTorch tp 2 (2 processes x 1 thread) |
#   PyTorch tp 1, intra-op 2 + OpenBLAS 1
# Every run trains the same global batch (tensor parallelism does not split it). Tokens/s = B*T /
# median step time of the timed steps; per setting the best rep counts. PyTorch's tp 1 is the
# better of its two thread settings. "speed" = tokens/s at tp 2 / at tp 1. Communication share:
# meshtrain's from its --trace line (rank 0's tp collectives over its compute-track time, whole
# run), PyTorch's from torch_tp.py (rank 0's median time inside all_reduce over the median step).
# Before each run it waits up to QUIET_WAIT=60 s for a quiet machine (bench/lib.sh) and prints the
# load. About 3-4 minutes per rep on 2 idle cores.
set -uo pipefail
cd "$(dirname "$0")/.."

MESHTRAIN=${MESHTRAIN:-build/meshtrain}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
WARMUP=2
REPS=1
STEPS=8
MODEL=gpt-small
BATCH=8
SEQ=256
DATA=""

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
posint() { case "$2" in ''|*[!0-9]*|0) echo "tp_speed.sh: $1 must be a positive integer" >&2; exit 2 ;; esac; }
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) posint --reps "${2:-}"; REPS=$2; shift 2 ;;
    --steps) posint --steps "${2:-}"; STEPS=$2; shift 2 ;;
    --batch) posint --batch "${2:-}"; BATCH=$2; shift 2 ;;
    --seq) posint --seq "${2:-}"; SEQ=$2; shift 2 ;;
    --model) MODEL=${2:?--model needs a name}; shift 2 ;;
    --data) DATA=${2:?--data needs a file}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "tp_speed.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[ "$STEPS" -gt "$WARMUP" ] || { echo "tp_speed.sh: --steps must exceed the $WARMUP warm-up steps" >&2; exit 2; }
if [ -z "$DATA" ]; then
  for f in data/corpus.txt ../shared/data/tinyshakespeare.txt; do
    [ -s "$f" ] && { DATA=$f; break; }
  done
fi
[ -s "$DATA" ] || { echo "tp_speed.sh: no data (run scripts/setup.sh for data/corpus.txt, or --data FILE)" >&2; exit 2; }
[ -x "$MESHTRAIN" ] || { echo "tp_speed.sh: $MESHTRAIN not built (cmake --build build --target meshtrain)" >&2; exit 2; }

PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# busy_cores, wait_quiet (sets LOAD and BUSY), best, ratio
source bench/lib.sh

# One meshtrain run; sets TPS, SHARE and NOTE (or returns 1).
run_meshtrain() {  # tp threads tag
  local mf="$TMP/$3.jsonl" log="$TMP/$3.log" rc
  timeout "$RUN_TIMEOUT" "$MESHTRAIN" train --model "$MODEL" --data "$DATA" --tp "$1" --threads "$2" \
    --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --eval-every 0 --eval-batches 1 --log-every 0 \
    --metrics "$mf" --trace "$TMP/$3.trace.json" > "$log" 2>&1
  rc=$?
  [ "$rc" = 0 ] || { NOTE="FAILED (exit $rc): $(tail -n 3 "$log" | tr '\n' ' ')"; return 1; }
  read -r TPS NOTE <<< "$("$PY" - "$mf" "$((BATCH * SEQ))" "$WARMUP" <<'EOF'
import json, statistics, sys
rows = [r for r in (json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")) if "step_ms" in r]
timed = rows[int(sys.argv[3]):]
med = statistics.median(float(r["step_ms"]) for r in timed)
print(f"{int(sys.argv[2]) / (med / 1e3):.1f} median {med:.1f} ms/step over {len(timed)} steps,"
      f" loss {rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f}")
EOF
)"
  SHARE=$(sed -n 's/.*tp communication [0-9.]* ms = \([0-9]*\)% of its.*/\1/p' "$log" | head -n 1)
  [ -n "$SHARE" ] && NOTE="$NOTE, tp comm $SHARE% of compute-track time (trace)"
  return 0
}

# One PyTorch run; sets TPS, SHARE and NOTE (or returns 1; 2 when torch is missing).
run_torch() {  # tp intra blas
  local out rc
  out=$(timeout $((RUN_TIMEOUT + 120)) "$PY" bench/torch_tp.py --model "$MODEL" --data "$DATA" --tp "$1" \
          --intra-threads "$2" --blas-threads "$3" --batch "$BATCH" --seq "$SEQ" \
          --steps $((STEPS - WARMUP)) --warmup "$WARMUP" --max-seconds "$RUN_TIMEOUT" --json --quiet 2> "$TMP/torch.err")
  rc=$?
  if [ "$rc" != 0 ]; then
    NOTE="FAILED (exit $rc): $(tail -n 3 "$TMP/torch.err" | tr '\n' ' ')"
    grep -q "not installed" "$TMP/torch.err" && return 2
    return 1
  fi
  read -r TPS SHARE NOTE <<< "$("$PY" - "$out" "$1" <<'EOF'
import json, sys
r = json.loads(sys.argv[1].strip().splitlines()[-1])
share = f"{100 * r['comm_share']:.0f}" if int(sys.argv[2]) > 1 else "-"
c = r.get("cpu_cores", {})
print(r["tokens_per_s"], share, f"median {r['step_ms']['median']} ms/step over {r['steps']} steps, "
      f"loss {r['loss']['first']} -> {r['loss']['last']}"
      + (f", all-reduce {share}% of the step" if share != "-" else "")
      + f", cores own {c.get('own')} others {c.get('others')}")
EOF
)"
  [ "$SHARE" = "-" ] && SHARE=""
  return 0
}

echo "== tensor-parallel speed: $(date -u '+%Y-%m-%d %H:%M UTC'), $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p'), $(nproc) cores"
echo "   $MODEL B=$BATCH T=$SEQ, data $DATA, $STEPS steps ($WARMUP warm-up), $REPS rep(s); load:$(uptime | sed 's/.*load average://')"
echo "   meshtrain: $MESHTRAIN ($(git log -1 --format='%h %cd' --date=format:'%H:%M' 2>/dev/null))"

declare -A R SH P   # P[setting,rep] = tokens/s of that rep
LOADS=()
for ((r = 1; r <= REPS; r++)); do
  order=(mt1 pt1a mt2 pt2 pt1b)
  [ $((r % 2)) = 0 ] && order=(pt1b pt2 mt2 pt1a mt1)
  for s in "${order[@]}"; do
    wait_quiet
    LOADS+=("$LOAD")
    TPS="" SHARE=""
    case $s in
      mt1) label="meshtrain tp 1 x 2 threads"; run_meshtrain 1 2 "$r.tp1" ;;
      mt2) label="meshtrain tp 2 x 1 thread"; run_meshtrain 2 1 "$r.tp2" ;;
      pt1a) label="PyTorch tp 1, intra 1 BLAS 2"; run_torch 1 1 2 ;;
      pt1b) label="PyTorch tp 1, intra 2 BLAS 1"; run_torch 1 2 1 ;;
      pt2) label="PyTorch tp 2 x 1 thread"; run_torch 2 1 1 ;;
    esac
    rc=$?
    [ "$rc" = 2 ] && { echo "   PyTorch is not installed (apt-get install -y python3-torch python3-numpy)"; exit 2; }
    printf '   rep %d %-29s %9s tok/s  (%s; load %s, busy %s cores before)\n' "$r" "$label" "${TPS:--}" "$NOTE" "$LOAD" "$BUSY"
    [ "$rc" = 0 ] && R[$s]="${R[$s]:-} $TPS" && P[$s,$r]=$TPS
    [ "$rc" = 0 ] && [ -n "$SHARE" ] && SH[$s]="${SH[$s]:-} $SHARE%"
  done
done

mt1=$(best ${R[mt1]:-}) mt2=$(best ${R[mt2]:-}) pt2=$(best ${R[pt2]:-})
a=$(best ${R[pt1a]:-}) b=$(best ${R[pt1b]:-})
pt1=$(best $a $b) which=""
[ -n "$pt1" ] && { [ "$pt1" = "$a" ] && which="1,2" || which="2,1"; }
echo
printf '%-10s %10s %10s %6s %14s | %10s %10s %6s %14s\n' model "mt tp1" "mt tp2" speed "mt tp comm" "pt tp1" "pt tp2" speed "pt all-reduce"
printf '%-10s %10s %10s %6s %14s | %10s %10s %6s %14s\n' "$MODEL" "${mt1:--}" "${mt2:--}" "$(ratio "$mt2" "$mt1")" \
  "${SH[mt2]:- -}" "${pt1:--}${which:+ ($which)}" "${pt2:--}" "$(ratio "$pt2" "$pt1")" "${SH[pt2]:- -}"
echo "(tokens/s of the batch, best of $REPS rep(s); speed = tp 2 / tp 1; meshtrain's tp 2 is $(ratio "$mt2" "$pt2")x PyTorch's tp 2;"
echo " pt tp1: best of intra-op,OpenBLAS = 1,2 and 2,1; loads before the runs: ${LOADS[*]}; load at end:$(uptime | sed 's/.*load average://'))"
ms="" ps=""
for ((r = 1; r <= REPS; r++)); do
  ms="$ms $(ratio "${P[mt2,$r]:-}" "${P[mt1,$r]:-}")"
  ps="$ps $(ratio "${P[pt2,$r]:-}" "$(best "${P[pt1a,$r]:-}" "${P[pt1b,$r]:-}")")"
done
echo "per rep (runs minutes apart, so they share the machine's speed of the moment): meshtrain tp 2 / tp 1:$ms"
echo "  (median $(median $ms)); PyTorch tp 2 / tp 1:$ps (median $(median $ps))"
