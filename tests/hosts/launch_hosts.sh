#!/usr/bin/env bash
# `meshtrain launch --hosts FILE --grow` across two hosts (tests/hosts/netns.sh), one rank on each,
# --dp 2. In the middle of the run host b's network is cut: the job must go on on host a alone
# (dp 1, the same global batch) within the communication deadline plus the restart; when the
# link comes back, --grow must take host b in again (the job stops at a step boundary with a
# checkpoint and resumes at dp 2 on both hosts). Checked: the events (the failure names host b,
# the layouts and hosts of both restarts), every step's metrics line exactly once, each loss
# within 1e-5 relative of an uninterrupted single-rank run, and the seconds from the cut until
# the job ran again. Prints the events and the timings (docs/benchmarks.md, "Elastic training").
# Usage: launch_hosts.sh MESHTRAIN MPIRUN   (exit 77: skipped, with the reason)
set -euo pipefail
bin=$(readlink -f "$1") mpirun=$2
deadline=5  # --comm-timeout, seconds
grace=25    # what noticing the cut and restarting may take beyond it
steps=50  # float32 round-off between layouts stays below 1e-5 relative this long (docs/launch.md)
source "$(dirname "$0")/netns.sh"
hosts_up "$mpirun"
write_random_corpus "$dir/corpus.txt"
printf '%s slots=1\n%s slots=1  # host b\n' "$ip_a" "$ip_b" > "$dir/hosts.txt"
common=(train --data "$dir/corpus.txt" --batch 64 --seq 64 --steps "$steps" --warmup 5 --eval-every 0 --eval-batches 1
        --threads 1 --checkpoint-every 5 --comm-timeout "$deadline" --quiet)

# The uninterrupted curve (one rank).
"$bin" "${common[@]}" --checkpoint-dir "$dir/ref" --metrics "$dir/ref.jsonl"

ip netns exec "$ns_a" env "${mpi_env[@]}" "$bin" launch --hosts "$dir/hosts.txt" --mpirun "$mpirun" --grow \
  --probe-every-s 1 --probe-timeout-s 10 --events "$dir/events.jsonl" -- \
  "${common[@]}" --dp 2 --checkpoint-dir "$dir/ck" --metrics "$dir/run.jsonl" > "$dir/launch.log" 2>&1 &
job=$!
lines() { [ -f "$dir/run.jsonl" ] && wc -l < "$dir/run.jsonl" || echo 0; }
has_event() { [ -f "$dir/events.jsonl" ] && [ "$(grep -c "\"event\":\"$1\"" "$dir/events.jsonl")" -ge "${2:-1}" ]; }
fail() { cat "$dir/launch.log" | grep -v '^$' | tail -40; echo "FAIL: $*"; exit 1; }
wait_for() {  # wait_for SECONDS COMMAND...: until COMMAND holds, the launcher still running
  local until=$(($(date +%s) + $1)); shift
  until "$@"; do
    kill -0 "$job" 2> /dev/null || return 1
    [ "$(date +%s)" -lt "$until" ] || return 1
    sleep 0.1
  done
}
at_least() { [ "$(lines)" -ge "$1" ]; }

wait_for 120 at_least 12 || fail "the two-host job did not reach step 12"
t_cut=$(date +%s.%N)
ip -n "$ns_b" link set "$veth_b" down
echo "cut host b's link at step $(lines)"
wait_for $((deadline + grace + 30)) has_event resumed 1 || fail "the job did not resume after the cut"
t_resumed=$(date +%s.%N)
# The job runs on host a alone for a while; then host b comes back.
cut_lines=$(lines)
wait_for 120 at_least $((cut_lines + 4)) || fail "the job on host a alone made no progress"
ip -n "$ns_b" link set "$veth_b" up
t_back=$(date +%s.%N)
echo "host b's link back at step $(lines)"
wait_for 120 has_event resumed 2 || fail "--grow did not take host b back"
t_grown=$(date +%s.%N)
wait "$job" || fail "launch exited $?"
grep -v '^$' "$dir/launch.log" | grep '^launch:' | sed 's/^/  /'

python3 - "$dir/events.jsonl" "$dir/ref.jsonl" "$dir/run.jsonl" "$ip_a" "$ip_b" "$t_cut" "$t_resumed" "$t_back" "$t_grown" \
  "$deadline" "$grace" <<'PY'
import json, sys
events, ref, run, ip_a, ip_b = sys.argv[1:6]
t_cut, t_resumed, t_back, t_grown = map(float, sys.argv[6:10])
deadline, grace = float(sys.argv[10]), float(sys.argv[11])
ev = [json.loads(l) for l in open(events)]
kinds = [e["event"] for e in ev]
want = ["start", "failure", "restart", "resumed", "grow", "restart", "resumed", "done"]
assert kinds == want, f"events {kinds}, expected {want}"
start, failure, shrink, resumed1, grow, regrow, resumed2, done = ev
assert start["hosts"] == f"{ip_a}:1,{ip_b}:1", start
assert failure["lost_hosts"] == [ip_b], f"the failure should name host b as lost: {failure}"
assert shrink["layout"] == "dp=1 tp=1 pp=1" and shrink["hosts"] == f"{ip_a}:1", shrink
assert grow["back"] == [ip_b], grow
assert regrow["reason"] == "grow" and regrow["layout"] == "dp=2 tp=1 pp=1" and regrow["hosts"] == f"{ip_a}:1,{ip_b}:1", regrow
assert done["layout"] == "dp=2 tp=1 pp=1", done
a = [json.loads(l) for l in open(ref)]
b = [json.loads(l) for l in open(run)]
steps = [x["step"] for x in b]
assert steps == list(range(1, len(a) + 1)), f"the metrics hold steps {steps[:3]}..{steps[-3:]} ({len(steps)} lines), not each of 1..{len(a)} once"
rel = [abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(b, a)]
worst = max(rel)
if worst >= 1e-5:
    first = next(i for i, r in enumerate(rel) if r >= 1e-5)
    print(f"first step off the curve: {first + 1}: {b[first]['loss']} against {a[first]['loss']}")
cut_to_resumed = t_resumed - t_cut
print(f"failure noticed {failure['time_s']:.1f} s into the run; work lost {failure['work_lost_s']:.2f} s "
      f"(checkpoint {failure['checkpoint']}); restart {resumed1['restart_s']:.2f} s")
print(f"cut -> running again on host a: {cut_to_resumed:.1f} s (deadline {deadline:.0f} s)")
print(f"link back -> running again on both hosts: {t_grown - t_back:.1f} s (the stop at a step boundary and the restart: {resumed2['restart_s']:.2f} s)")
print(f"steps 1..{len(b)} once each; worst relative difference from the uninterrupted single-rank run {worst:.2e}")
assert cut_to_resumed < deadline + grace, f"the job ran again {cut_to_resumed:.1f} s after the cut, beyond {deadline + grace:.0f} s"
assert worst < 1e-5, "the elastic run left the single-rank curve"
print("LAUNCH HOSTS OK")
PY
