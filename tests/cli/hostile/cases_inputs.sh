# Every kind of input file train reads, malformed: uint16 token files, gzip IDX files, a machine
# file, a metrics file resumed into. Refusals name the file and leave every file as it was.
# Sourced by tests/cli/hostile.sh ($MT: the program, $WORK: the scratch folder with corpus.txt).
python3 - "$WORK" <<'PY'
import gzip, struct, sys
w = sys.argv[1]
open(f"{w}/odd.bin", "wb").write(b"\x01\x00\x02")
open(f"{w}/big.bin", "wb").write(struct.pack("<4000H", *[(i * 37) % 1000 for i in range(4000)]))
open(f"{w}/short.bin", "wb").write(struct.pack("<10H", *range(10)))
# llm.c's header (magic 20240520, version 1) recording more tokens than the file holds
open(f"{w}/llmc.bin", "wb").write(struct.pack("<256i", 20240520, 1, 5000, *([0] * 253)) + struct.pack("<100H", *range(100)))
import os
os.makedirs(f"{w}/gz", exist_ok=True)
images = struct.pack(">IIII", 0x803, 20, 28, 28) + bytes(20 * 784)
open(f"{w}/gz/train-images-idx3-ubyte.gz", "wb").write(gzip.compress(images)[:100])  # cut short
PY
T=(train --steps 1 --quiet)
expect 2 "^meshtrain: data file odd.bin: has an odd size \(3 bytes\) for a raw uint16 token file" -- "$MT" "${T[@]}" --data odd.bin
expect 2 "^meshtrain: the data file big.bin has token ids up to 999 but the model's vocabulary is 256" -- \
  "$MT" "${T[@]}" --data big.bin
expect 2 "^meshtrain: data file short.bin: is too short: 10 tokens" -- "$MT" "${T[@]}" --data short.bin
expect 2 "^meshtrain: data file llmc.bin: has a malformed llm.c header: it records 5000" -- "$MT" "${T[@]}" --data llmc.bin
expect 2 "^meshtrain: data directory gz has neither train-labels-idx1-ubyte" -- \
  "$MT" "${T[@]}" --model cnn-small --data gz

# ---- a machine file that is not one: refused naming it, before any rank starts ----
expect 2 "^meshtrain: corpus.txt is not valid JSON: syntax error at line 1, column 1" -- "$MT" "${T[@]}" --data corpus.txt --machine corpus.txt
mkdir -p "$WORK/mdir"
expect 2 "mdir" -- "$MT" "${T[@]}" --data corpus.txt --machine mdir

# ---- a metrics file resumed into: lines past the checkpoint and cut lines removed, the old file kept ----
expect 0 "" --may-write rk --may-write m.jsonl -- \
  "$MT" train --data corpus.txt --steps 3 --quiet --checkpoint-dir rk --checkpoint-every 1 --metrics m.jsonl
printf 'garbage line\n{"step": 99}\n' >> "$WORK/m.jsonl"
expect 0 "metrics file m.jsonl: kept its lines of steps 1-3 and removed 2 line\(s\).*kept as m.jsonl.old" \
  --may-write rk --may-write m.jsonl --may-write m.jsonl.old -- \
  "$MT" train --data corpus.txt --steps 4 --quiet --checkpoint-dir rk --resume --metrics m.jsonl
expect 0 "^4 m.jsonl$" -- bash -c "wc -l < m.jsonl | sed 's/\$/ m.jsonl/'"
rm -rf "$WORK"/*.bin "$WORK/gz" "$WORK/mdir" "$WORK/rk" "$WORK"/m.jsonl*
