# Sourced by the multi-host tests: network namespaces stand for hosts (two by default, three
# with `hosts_up MPIRUN 3`), joined by a bridge in host a's namespace that each other host reaches
# through a veth pair, and `launch` is an mpirun across them (no sshd: an rsh agent runs `ip
# netns exec`; the TCP transport and the runtime's own channel on the hosts' subnet only).
# Everything is torn down on exit, whatever happened. Needs root and iproute2; exits 77
# (skipped) with the reason where namespaces cannot be made.
#
# After `hosts_up MPIRUN [N]`: $ns_a/$ns_b (and $ns_c), their addresses $ip_a/$ip_b ($ip_c),
# $veth_b ($veth_c): host b's (c's) own end of its link, taken down to cut the host off; $dir (a
# scratch directory), the array launch=(... mpirun with every option, one rank on host a and
# one on b ...) and the array mpi_env=(OMPI_...=...) holding those options as OpenMPI's
# environment variables.
skip() { echo "SKIP: $*"; exit 77; }

hosts_down() {
  for ns in "$ns_a" "$ns_b" "${ns_c:-}"; do
    [ -n "$ns" ] || continue
    if ip netns list 2> /dev/null | grep -qw "$ns"; then
      ip netns pids "$ns" 2> /dev/null | xargs -r kill -9 2> /dev/null || true
      ip netns del "$ns" 2> /dev/null || true  # takes its ends of the veth pairs, and so the pairs
    fi
  done
  rm -rf "$dir"
}

hosts_up() {
  local mpirun=$1 n=${2:-2}
  [ "$(id -u)" -eq 0 ] || skip "making network namespaces needs root"
  command -v ip > /dev/null || skip "no 'ip' command (Debian package iproute2)"
  local tag=$$ net=$(($$ % 200 + 20))  # 10.231.<net>.0/24
  ns_a=mt${tag}a ns_b=mt${tag}b ns_c=
  ip_a=10.231.$net.1 ip_b=10.231.$net.2 ip_c=
  veth_b=v$ns_b veth_c=
  local others=("$ns_b")
  if [ "$n" -ge 3 ]; then
    ns_c=mt${tag}c ip_c=10.231.$net.3 veth_c=v$ns_c
    others+=("$ns_c")
  fi
  dir=$(mktemp -d)
  trap hosts_down EXIT
  # Entering a namespace remounts /sys, which a chroot or an unprivileged container refuses.
  { ip netns add "$ns_a" && ip netns exec "$ns_a" true; } > /dev/null 2>&1 \
    || skip "cannot create and enter a network namespace here (a chroot, or a container without CAP_SYS_ADMIN)"
  ip -n "$ns_a" link add "br$ns_a" type bridge > /dev/null 2>&1 \
    || skip "cannot make a bridge device in a network namespace here (the kernel's bridge module)"
  ip -n "$ns_a" link set lo up
  ip -n "$ns_a" addr add "$ip_a/24" dev "br$ns_a"
  ip -n "$ns_a" link set "br$ns_a" up
  local ns i=2
  for ns in "${others[@]}"; do  # host x: its end v<x> in its namespace, the other p<x> on a's bridge
    ip netns add "$ns"
    ip link add "p$ns" netns "$ns_a" type veth peer name "v$ns" netns "$ns"
    ip -n "$ns_a" link set "p$ns" master "br$ns_a"
    ip -n "$ns_a" link set "p$ns" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "10.231.$net.$i/24" dev "v$ns"
    ip -n "$ns" link set "v$ns" up
    i=$((i + 1))
  done
  # A TCP connection with unacknowledged data (the launcher's kill order to a daemon behind a
  # broken link) gives up after tcp_retries2 retransmissions: 15 by default (about 15 minutes),
  # 3 here (about 3 s on this link). Keepalive (below) covers the idle connections. Per host
  # (namespace).
  for ns in "$ns_a" "${others[@]}"; do ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_retries2=3; done

  # The rsh agent mpirun calls as `agent HOST COMMAND...`: the command runs in that host's namespace.
  cat > "$dir/agent" <<AGENT
#!/bin/sh
host=\$1; shift
case "\$host" in
  $ip_a) ns=$ns_a ;;
  $ip_b) ns=$ns_b ;;
  ${ip_c:-none}) ns=${ns_c:-none} ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
AGENT
  chmod +x "$dir/agent"
  # mpirun runs in host a; the daemon of host b reaches it over its link. The keepalive
  # settings make the runtime notice a silent peer in about 11 s instead of OpenMPI's default
  # of minutes (docs/comm.md, "Two hosts and faults").
  launch=(ip netns exec "$ns_a" "$mpirun" --allow-run-as-root --oversubscribe --bind-to none
          --host "$ip_a:1,$ip_b:1" -np 2 --mca plm_rsh_agent "$dir/agent"
          --mca btl tcp,self --mca btl_tcp_if_include "10.231.$net.0/24" --mca oob_tcp_if_include "10.231.$net.0/24"
          --mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3)

  # The same settings as OpenMPI's environment variables, for a program that starts mpirun
  # itself (`meshtrain launch --hosts`): `env "${mpi_env[@]}" ...`.
  mpi_env=(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
           OMPI_MCA_hwloc_base_binding_policy=none OMPI_MCA_plm_rsh_agent="$dir/agent" OMPI_MCA_btl=tcp,self
           OMPI_MCA_btl_tcp_if_include="10.231.$net.0/24" OMPI_MCA_oob_tcp_if_include="10.231.$net.0/24"
           OMPI_MCA_oob_tcp_keepalive_time=5 OMPI_MCA_oob_tcp_keepalive_intvl=2 OMPI_MCA_oob_tcp_keepalive_probes=3)

  # Prove the placement: each rank prints the address of the namespace it runs in.
  timeout 120 "${launch[@]}" /bin/sh -c \
    'echo "rank $OMPI_COMM_WORLD_RANK: $(ip -brief addr | grep -o "10\.231\.[0-9]*\.[0-9]*")"' \
    | sort > "$dir/placement.txt"
  cat "$dir/placement.txt"
  grep -qx "rank 0: $ip_a" "$dir/placement.txt" && grep -qx "rank 1: $ip_b" "$dir/placement.txt" \
    || { echo "FAIL: the ranks did not run one in each namespace"; exit 1; }
}

# A small corpus (the layout tests' sentences).
write_corpus() {
  python3 - "$1" <<'PY'
import sys
lines = ["It is a truth universally acknowledged, that a single man\n",
         "in possession of a good fortune, must be in want of a wife.\n",
         "However little known the feelings or views of such a man\n"]
open(sys.argv[1], "w").write("".join(lines[(i * 7) % 3] for i in range(600)))
PY
}

# Words drawn at random (seeded): the loss stays well above zero, where relative differences
# mean something, for hundreds of steps.
write_random_corpus() {
  python3 - "$1" <<'PY'
import random, sys
r = random.Random(7)
words = ("the of and to in is was that for it with as his on be at by had not are but from or have an they which "
         "one you were her all she there would their we him been has when who will more no if out so said what up").split()
open(sys.argv[1], "w").write(" ".join(r.choice(words) for _ in range(60000)))
PY
}

# four: the launch command of hosts_up ("${launch[@]}", one rank on each host) with two ranks on
# each host instead.
two_ranks_a_host() {
  four=()
  local prev="" a
  for a in "${launch[@]}"; do
    case "$prev/$a" in
      "-np/2") four+=(4) ;;
      */"$ip_a:1,$ip_b:1") four+=("$ip_a:2,$ip_b:2") ;;
      *) four+=("$a") ;;
    esac
    prev=$a
  done
}
