#!/usr/bin/env bash
# A host that goes silent in the middle of a two-host run (tests/hosts/netns.sh, --dp 2, one rank
# per host): the veth link taken down (`partition`) or host b's rank stopped with SIGSTOP
# (`sigstop`). The whole job must end — mpirun returns, no process of it is left in either
# namespace — with meshtrain's own error naming the operation, its group and the rank that did
# not answer, within the communication deadline plus a few seconds. Then `--resume` from the
# last checkpoint, across the two hosts again, continues on the uninterrupted curve (every step
# within 1e-5 of a run that never failed). Prints the time from the fault to the end of the job.
# Usage: host_fault.sh MESHTRAIN MPIRUN partition|sigstop   (exit 77: skipped, with the reason)
set -euo pipefail
bin=$(readlink -f "$1") mpirun=$2 fault=$3
case "$fault" in partition | sigstop) ;; *) echo "usage: $0 MESHTRAIN MPIRUN partition|sigstop" >&2; exit 2 ;; esac
deadline=5   # --comm-timeout, seconds
grace=20     # what the job may take beyond it to end
source "$(dirname "$0")/netns.sh"
hosts_up "$mpirun"
write_corpus "$dir/corpus.txt"
common=(train --data "$dir/corpus.txt" --batch 32 --seq 64 --steps 60 --warmup 5 --eval-every 0 --eval-batches 1
        --threads 1 --dp 2 --checkpoint-every 10 --comm-timeout "$deadline")

# The uninterrupted curve (threads, one process).
"$bin" "${common[@]}" --quiet --checkpoint-dir "$dir/ref" --metrics "$dir/ref.jsonl"

# The run that meets the fault.
"${launch[@]}" "$bin" "${common[@]}" --backend mpi --checkpoint-dir "$dir/ck" --metrics "$dir/run.jsonl" \
  > "$dir/run.log" 2>&1 &
job=$!
lines() { [ -f "$dir/run.jsonl" ] && wc -l < "$dir/run.jsonl" || echo 0; }
for _ in $(seq 1200); do
  [ "$(lines)" -ge 13 ] && break
  kill -0 "$job" 2> /dev/null || break
  sleep 0.1
done
if [ "$(lines)" -lt 13 ] || ! kill -0 "$job" 2> /dev/null; then
  cat "$dir/run.log"
  echo "FAIL: the two-host run did not reach step 13 while running"
  exit 1
fi
victim=""
for p in $(ip netns pids "$ns_b"); do
  [ "$(cat /proc/$p/comm 2> /dev/null)" = meshtrain ] && victim=$p
done
[ -n "$victim" ] || { echo "FAIL: no meshtrain process in host b"; exit 1; }
t0=$(date +%s.%N)
if [ "$fault" = partition ]; then
  ip -n "$ns_b" link set "$veth_b" down
else
  kill -STOP "$victim"
fi
echo "fault: $fault at step $(lines) of the run"
rc=0
while kill -0 "$job" 2> /dev/null; do
  if awk -v t0="$t0" -v now="$(date +%s.%N)" -v lim=$((deadline + grace)) 'BEGIN { exit !(now - t0 > lim) }'; then
    cat "$dir/run.log"
    echo "FAIL: mpirun still running $((deadline + grace)) s after the fault"
    exit 1
  fi
  sleep 0.1
done
wait "$job" || rc=$?
t1=$(date +%s.%N)
elapsed=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
echo "the job ended ${elapsed} s after the fault (deadline ${deadline} s), mpirun exit code $rc"
echo "its messages:"
grep -i "meshtrain\|deadline\|abort" "$dir/run.log" | head -8 | sed 's/^/  /'
[ "$rc" -ne 0 ] || { echo "FAIL: the job exited 0 after a fault"; exit 1; }
grep -q "deadline passed while waiting for rank 1" "$dir/run.log" \
  || { echo "FAIL: no meshtrain error naming rank 1 in the job's output"; exit 1; }
grep -q "dp" "$dir/run.log" || { echo "FAIL: the error does not name the group"; exit 1; }
sleep 2
left=$( (ip netns pids "$ns_a"; ip netns pids "$ns_b") | wc -l)
[ "$left" -eq 0 ] || { echo "FAIL: $left process(es) of the job left in the namespaces"; ps -o pid,stat,comm -p "$(ip netns pids "$ns_b" | head -1)"; exit 1; }

# Back to health, and on from the last checkpoint.
[ "$fault" = partition ] && ip -n "$ns_b" link set "$veth_b" up
timeout 300 "${launch[@]}" "$bin" "${common[@]}" --backend mpi --checkpoint-dir "$dir/ck" --metrics "$dir/run.jsonl" \
  --resume --quiet
python3 - "$dir/ref.jsonl" "$dir/run.jsonl" <<'PY'
import json, sys
a = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(sys.argv[1])}
b = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(sys.argv[2])}
assert sorted(b) == sorted(a), f"the resumed run's steps {sorted(b)[:3]}..{sorted(b)[-3:]} differ from the reference's"
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
print(f"resumed: steps {min(b)}..{max(b)}, worst relative difference from the uninterrupted run {worst:.2e}")
assert worst < 1e-5, "the resumed run left the uninterrupted curve"
print("HOST FAULT OK")
PY
