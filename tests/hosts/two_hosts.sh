#!/usr/bin/env bash
# Two "hosts" on one machine: two network namespaces joined by a veth pair, one MPI rank in
# each, launched by mpirun across them (no sshd: an rsh agent that runs `ip netns exec`, the TCP
# transport on the veth subnet only). Trains the given layout over the two hosts and checks
# every step's loss against the same layout on threads in one process (1e-5 relative).
# Everything made here is torn down on exit, whatever happened.
#
# Usage: two_hosts.sh MESHTRAIN MPIRUN LAYOUT-FLAGS...   (needs root and iproute2; exit 77 =
# skipped, with the reason, where network namespaces cannot be made)
set -euo pipefail
bin=$(readlink -f "$1") mpirun=$2
shift 2
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "making network namespaces needs root"
command -v ip > /dev/null || skip "no 'ip' command (Debian package iproute2)"

tag=$$
net=$((tag % 200 + 20))  # 10.231.<net>.0/24
a=mt${tag}a b=mt${tag}b
ip_a=10.231.$net.1 ip_b=10.231.$net.2
dir=$(mktemp -d)
cleanup() {
  for ns in "$a" "$b"; do
    if ip netns list 2> /dev/null | grep -qw "$ns"; then
      ip netns pids "$ns" 2> /dev/null | xargs -r kill -9 2> /dev/null || true
      ip netns del "$ns" 2> /dev/null || true  # takes its end of the veth pair, and so the pair
    fi
  done
  rm -rf "$dir"
}
trap cleanup EXIT
ip netns add "$a" 2> /dev/null || skip "cannot create a network namespace here (a container without CAP_SYS_ADMIN?)"
ip netns add "$b"
ip link add "v$a" type veth peer name "v$b"
ip link set "v$a" netns "$a"
ip link set "v$b" netns "$b"
ip -n "$a" addr add "$ip_a/24" dev "v$a"
ip -n "$b" addr add "$ip_b/24" dev "v$b"
for ns in "$a" "$b"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "v$ns" up
done
ip -n "$a" link show "v$a" | grep -q "state UP\|LOWER_UP" || { echo "FAIL: the veth link is not up"; ip -n "$a" link show; exit 1; }

# The rsh agent mpirun calls as `agent HOST COMMAND...`: the command runs inside that host's
# namespace.
cat > "$dir/agent" <<AGENT
#!/bin/sh
host=\$1; shift
case "\$host" in
  $ip_a) ns=$a ;;
  $ip_b) ns=$b ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
AGENT
chmod +x "$dir/agent"

python3 - "$dir/corpus.txt" <<'PY'
import sys
lines = ["It is a truth universally acknowledged, that a single man\n",
         "in possession of a good fortune, must be in want of a wife.\n",
         "However little known the feelings or views of such a man\n"]
open(sys.argv[1], "w").write("".join(lines[(i * 7) % 3] for i in range(600)))
PY
common=(train --data "$dir/corpus.txt" --batch 12 --seq 32 --steps 20 --warmup 5 --eval-every 0 --eval-batches 1
        --threads 1 --quiet "$@")
"$bin" "${common[@]}" --metrics "$dir/threads.jsonl"
# mpirun runs in host a; the daemon of host b reaches it over the veth pair.
launch=(ip netns exec "$a" timeout 300 "$mpirun" --allow-run-as-root --oversubscribe --bind-to none
        --host "$ip_a:1,$ip_b:1" -np 2 --mca plm_rsh_agent "$dir/agent"
        --mca btl tcp,self --mca btl_tcp_if_include "10.231.$net.0/24" --mca oob_tcp_if_include "10.231.$net.0/24")
# First prove the placement: each rank prints the addresses of the namespace it runs in.
"${launch[@]}" /bin/sh -c 'echo "rank $OMPI_COMM_WORLD_RANK: $(ip -brief addr | grep -o "10\.231\.[0-9]*\.[0-9]*")"' \
  | sort | tee "$dir/placement.txt"
grep -qx "rank 0: $ip_a" "$dir/placement.txt" && grep -qx "rank 1: $ip_b" "$dir/placement.txt" \
  || { echo "FAIL: the ranks did not run one in each namespace"; exit 1; }
"${launch[@]}" "$bin" "${common[@]}" --backend mpi --metrics "$dir/hosts.jsonl"
python3 - "$dir/threads.jsonl" "$dir/hosts.jsonl" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 20, (len(a), len(b))
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"steps {len(a)}, first loss {a[0]:.4f}, last {a[-1]:.4f}, worst relative difference {worst:.2e}")
assert a[-1] < a[0] - 0.5, "the curve did not move"
assert worst < 1e-5, "the two-host run differs from the threads run"
print("TWO HOSTS OK")
PY
