# The hostile-input checks' helpers (sourced by tests/cli/hostile.sh and its case files).
#
#   expect CODE REGEX [--may-write PATH ...] -- COMMAND ...
# runs COMMAND (a hang guard of $HOSTILE_TIMEOUT seconds, default 120) in $WORK and asserts
# its exit code is CODE, its output (stdout and stderr together) matches the extended regular
# expression REGEX, and that no file under $WORK changed, appeared or vanished except the
# paths after --may-write (relative to $WORK; a path that is a directory covers everything
# under it). Checksums (sha256) of every file under $WORK are taken before and after. A
# refusal (CODE 2) must leave $WORK exactly as it was, so give it no --may-write.
# Results are counted in PASSED and FAILED; each failure prints what differed.
set -u

: "${HOSTILE_TIMEOUT:=120}"
PASSED=0
FAILED=0
declare -A CASES=()  # cases per subcommand (tallied by expect, printed by tally)

_subcommand() {  # the meshtrain subcommand a case runs: the words after the program
  local prev="" a
  for a in "$@"; do
    if [ "$prev" = "$MT" ]; then
      case "$a" in
        bench|checkpoint|trace|model) prev=$a; continue ;;
        train|launch|plan|calibrate|schedule|eval|generate) echo "$a"; return ;;
      esac
    fi
    case "$prev" in bench|checkpoint|trace|model) echo "$prev $a"; return ;; esac
    prev=$a
  done
  # bash -c '... "$0" SUBCOMMAND ...' "$MT": the word after "$0"
  local text="$*" w
  for w in train launch plan calibrate schedule eval generate "trace render" "checkpoint convert" "bench comm" "model show"; do
    case "$text" in *'"$0" '"$w"*|*'"\$0" '"$w"*|*"\"\$0\" $w"*) echo "$w"; return ;; esac
  done
  echo "other"
}

tally() {  # prints the cases per subcommand, most first
  local k
  for k in "${!CASES[@]}"; do echo "${CASES[$k]} $k"; done | sort -rn | awk '{n=$1; $1=""; printf "  %-20s %d\n", substr($0, 2), n}'
}

_snapshot() {  # every file under $WORK with its checksum, sorted
  (cd "$WORK" && find . \( -type f -o -type l \) -print0 | LC_ALL=C sort -z |
     xargs -0 -r sha256sum 2>/dev/null) || true
}

_allowed() {  # _allowed PATH MAY... : PATH (./x/y) is one of the MAY paths or lies under one
  local p=${1#./} m
  shift
  for m in "$@"; do
    m=${m#./}
    [ "$p" = "$m" ] && return 0
    case "$p" in "$m"/*) return 0 ;; esac
  done
  return 1
}

expect() {
  local code=$1 regex=$2 may=()
  shift 2
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    [ "$1" = "--may-write" ] && { may+=("$2"); shift 2; continue; }
    echo "hostile: bad use of expect: $1" >&2
    return 1
  done
  shift  # --
  local sub
  sub=$(_subcommand "$@")
  CASES[$sub]=$(( ${CASES[$sub]:-0} + 1 ))
  local before after out rc changed=""
  before=$(_snapshot)
  out=$(cd "$WORK" && timeout --kill-after=10 "$HOSTILE_TIMEOUT" "$@" 2>&1 </dev/null)
  rc=$?
  after=$(_snapshot)
  # Lines present on one side only: files written, created or removed.
  while IFS= read -r line; do
    [ -z "$line" ] && continue
    local path=${line#*  }
    _allowed "$path" "${may[@]+"${may[@]}"}" || changed+="$path "
  done < <(diff <(echo "$before") <(echo "$after") | grep -E '^[<>] ' | cut -c3- | sort -u)
  local what="$*"
  what=${what//$'\n'/ }
  [ ${#what} -gt 160 ] && what="${what:0:157}..."
  if [ "$rc" != "$code" ]; then
    echo "FAIL: $what: exit $rc, expected $code"; echo "$out" | tail -5 | sed 's/^/    /'
    FAILED=$((FAILED + 1))
  elif ! grep -Eq -- "$regex" <<<"$out"; then
    echo "FAIL: $what: output does not match /$regex/"; echo "$out" | tail -5 | sed 's/^/    /'
    FAILED=$((FAILED + 1))
  elif [ -n "$changed" ]; then
    echo "FAIL: $what: changed files it did not mean to: $changed"
    FAILED=$((FAILED + 1))
  else
    echo "ok: $what"
    PASSED=$((PASSED + 1))
  fi
}
