#!/usr/bin/env bash
# The hostile-input script (run by the suite): every case a hostile run of the program found,
# each asserting its exit code, its sentence and that no file it did not mean to write changed
# (checksums before and after; tests/cli/hostile/lib.sh). The cases live in
# tests/cli/hostile/cases_*.sh, by area. Usage: hostile.sh MESHTRAIN_BINARY [CASES_FILE ...]
set -u
here=$(cd "$(dirname "$0")" && pwd)
MT=$(realpath "$1")
SOURCE_DIR=$(cd "$here/../.." && pwd)  # the repository (examples/)
shift
WORK=$(mktemp -d "${TMPDIR:-/tmp}/meshtrain-hostile.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
source "$here/hostile/lib.sh"
# A small corpus every case may read.
head -c 200000 /usr/share/games/fortunes/fortunes 2>/dev/null > "$WORK/corpus.txt" ||
  for i in $(seq 4000); do echo "to be or not to be, that is the question $i"; done > "$WORK/corpus.txt"
[ -s "$WORK/corpus.txt" ] || for i in $(seq 4000); do echo "to be or not to be $i"; done > "$WORK/corpus.txt"
files=("$@")
[ ${#files[@]} -eq 0 ] && files=("$here"/hostile/cases_*.sh)
for f in "${files[@]}"; do
  echo "== $(basename "$f")"
  source "$f"
done
echo "cases per subcommand:"
tally
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
