# Every JSON file meshtrain reads goes through one strict reading (io/json.h): a key given
# twice at any depth, a number beyond a double and a count beyond its field's range are
# refused with exit 2, naming the file and the field; nothing wraps, nothing takes the last
# value. Sourced by tests/cli/hostile.sh ($MT: the program, $WORK: the scratch folder with
# corpus.txt).
J=(train --data corpus.txt --steps 2 --quiet)

# ---- model configs: GPT and CNN alike ----
# refused_config NAME TEXT REGEX: train --config NAME, the file holding TEXT, exits 2 saying REGEX.
refused_config() {
  printf '%s' "$2" > "$WORK/$1"
  expect 2 "$3" -- "$MT" "${J[@]}" --config "$1"
}
refused_config gdup.json '{"n_layer": 2, "n_embd": 64, "n_head": 4, "n_head": 8, "vocab_size": 256, "block_size": 64}' \
  "^meshtrain: model config file gdup.json gives the field \"n_head\" more than once in the top-level object; keep one value for it"
refused_config gbig.json '{"n_layer": 2, "n_embd": 1e999, "n_head": 4, "vocab_size": 256, "block_size": 64}' \
  "^meshtrain: model config file gbig.json gives n_embd as 1e999, a number beyond the range of a double"
refused_config cdup.json '{"family": "cnn", "name": "resnet-small", "scale": 4, "scale": 16}' \
  "^meshtrain: model config file cdup.json gives the field \"scale\" more than once in the top-level object"
refused_config cname.json '{"family": "cnn", "name": "cnn-small", "scale": 4, "name": "resnet-small"}' \
  "^meshtrain: model config file cname.json gives the field \"name\" more than once in the top-level object"
refused_config cscale.json '{"family": "cnn", "name": "resnet-small", "scale": 4294967297}' \
  "^meshtrain: model config file cscale.json: \"scale\" must be an integer 1..16"
refused_config cempty.json '' "^meshtrain: model config file cempty.json is not valid JSON: it is empty; it must be an object"
rm -f "$WORK"/gdup.json "$WORK"/gbig.json "$WORK"/cdup.json "$WORK"/cname.json "$WORK"/cscale.json "$WORK"/cempty.json

# ---- cluster files: counts range-checked before they become ints ----
# cluster_json FILE 'PYTHON': the shipped h100-node example, changed by PYTHON on the text s.
cluster_json() {
  python3 - "$here/../../examples/clusters/h100-node.json" "$WORK/$1" "$2" <<'PY'
import sys
s = open(sys.argv[1], encoding="utf-8").read()
exec(sys.argv[3])
open(sys.argv[2], "w", encoding="utf-8").write(s)
PY
}
P=(plan --model gpt-tiny --global-batch 8)
cluster_json c_wrap.json 's = s.replace("\"nodes\": 1", "\"nodes\": 4294967297")'
expect 2 "^meshtrain: c_wrap.json: nodes is 4294967297, more than 1048576" -- "$MT" "${P[@]}" --cluster c_wrap.json
cluster_json c_float.json 's = s.replace("\"nodes\": 1", "\"nodes\": 1e12")'
expect 2 "^meshtrain: c_float.json: nodes is 1000000000000.0, not an integer from 1 to 1048576" -- \
  "$MT" "${P[@]}" --cluster c_float.json
cluster_json c_big.json 's = s.replace("\"gemm_tflops\": 650", "\"gemm_tflops\": 1e999")'
expect 2 "^meshtrain: c_big.json gives device.gemm_tflops as 1e999, a number beyond the range of a double" -- \
  "$MT" "${P[@]}" --cluster c_big.json
cluster_json c_dup.json 's = s.replace("\"nodes\": 1,", "\"nodes\": 1, \"nodes\": 4,")'
expect 2 "^meshtrain: c_dup.json gives the field \"nodes\" more than once in the top-level object" -- \
  "$MT" "${P[@]}" --cluster c_dup.json
cluster_json c_ndup.json 's = s.replace("\"latency_us\": 3", "\"latency_us\": 3, \"latency_us\": 1")'
expect 2 "^meshtrain: c_ndup.json gives the field \"latency_us\" more than once in links.intra_node" -- \
  "$MT" "${P[@]}" --cluster c_ndup.json
rm -f "$WORK"/c_*.json

# ---- machine files: made once by calibrate --quick, then changed ----
expect 0 "" --may-write m.json -- "$MT" calibrate --quick --out m.json
# machine_json FILE 'PYTHON': m.json changed by PYTHON on the text s.
machine_json() {
  python3 - "$WORK/m.json" "$WORK/$1" "$2" <<'PY'
import re, sys
s = open(sys.argv[1], encoding="utf-8").read()
exec(sys.argv[3])
open(sys.argv[2], "w", encoding="utf-8").write(s)
PY
}
machine_json m_dup.json 's = s.replace("{", "{\n  \"cores\": 1,", 1)'
machine_json m_wrap.json 's = re.sub(r"\"cores\": \d+", "\"cores\": 4294967297", s)'
machine_json m_big.json 's = re.sub(r"\"gflops\": [0-9.e+-]+", "\"gflops\": 1e999", s, count=1)'
machine_json m_ndup.json 's = re.sub("(\"threads\": [0-9]+)", "\\1, \\1", s, count=1)'
# A cluster of nodes of this machine, naming each file in turn.
for m in m_dup m_wrap m_big m_ndup; do
  printf '{"kind": "meshtrain cluster", "version": 1, "name": "cpu", "nodes": 1, "machine": "%s.json", "memory_gb": 4}' "$m" > "$WORK/c_$m.json"
done
expect 2 "machine names m_dup.json, which cannot be used \(m_dup.json gives the field \"cores\" more than once in the top-level object" -- \
  "$MT" "${P[@]}" --cluster c_m_dup.json
expect 2 "machine names m_wrap.json, which cannot be used \(m_wrap.json: cores is 4294967297, more than 1048576" -- \
  "$MT" "${P[@]}" --cluster c_m_wrap.json
expect 2 "machine names m_big.json, which cannot be used \(m_big.json gives [a-z]+\[0\].gflops as 1e999" -- \
  "$MT" "${P[@]}" --cluster c_m_big.json
expect 2 "machine names m_ndup.json, which cannot be used \(m_ndup.json gives the field \"threads\" more than once in [a-z]+\[0\]" -- \
  "$MT" "${P[@]}" --cluster c_m_ndup.json

# ---- plan for the machine file alone (--machine, or --cluster given one), and its refusals ----
expect 0 "^meshtrain plan: gpt-tiny on .* \(1 node x [0-9]+ ranks as threads on [0-9]+ cores\)" -- "$MT" "${P[@]}" --machine m.json
expect 0 "best as train flags: --batch 8 " -- "$MT" "${P[@]}" --cluster m.json
printf '{"kind": "meshtrain trace", "version": 1}' > "$WORK/k_other.json"
printf '{"name": "x"}' > "$WORK/k_none.json"
expect 2 "^meshtrain: k_other.json has kind \"meshtrain trace\", but plan reads a cluster file \(kind \"meshtrain cluster\"\) or a machine file \(kind \"meshtrain machine\", written by meshtrain calibrate\); give one$" -- \
  "$MT" "${P[@]}" --cluster k_other.json
expect 2 "^meshtrain: k_none.json has no kind, but plan reads a cluster file \(kind \"meshtrain cluster\"\) or a machine file" -- \
  "$MT" "${P[@]}" --cluster k_none.json
expect 2 "^meshtrain: k_other.json has kind \"meshtrain trace\", but --machine reads a machine file \(kind \"meshtrain machine\", written by meshtrain calibrate\); give one$" -- \
  "$MT" "${P[@]}" --machine k_other.json
expect 2 "^meshtrain: .*h100-node.json is a cluster file, not a machine file; give it with --cluster$" -- \
  "$MT" "${P[@]}" --machine "$here/../../examples/clusters/h100-node.json"
expect 2 "^meshtrain: plan takes one of --cluster FILE and --machine FILE, not both" -- "$MT" "${P[@]}" --machine m.json --cluster m.json
expect 2 "^meshtrain: plan needs the hardware to plan for: --machine FILE.json" -- "$MT" "${P[@]}"
expect 2 "^meshtrain: m_wrap.json: cores is 4294967297, more than 1048576" -- "$MT" "${P[@]}" --machine m_wrap.json
# A machine file of version 2 (before calibrate recorded the memory, and the convolutions and
# CNN layers of version 4): planned alone, refused.
machine_json m_v2.json 'import json; d = json.loads(s); [d.pop(k) for k in ("memory_bytes", "conv", "cnn_layers")]; d["version"] = 2; s = json.dumps(d, indent=2)'
expect 2 "^meshtrain: m_v2.json records no memory \(a version 2 machine file\); measure the machine again with meshtrain calibrate" -- \
  "$MT" "${P[@]}" --machine m_v2.json
expect 2 "^meshtrain: --svg m.json is the same file as --machine m.json" -- "$MT" "${P[@]}" --machine m.json --svg m.json --overwrite
rm -f "$WORK"/m.json "$WORK"/m_*.json "$WORK"/c_m_*.json "$WORK"/k_*.json

# replace_once FILE OLD NEW: the first OLD in FILE becomes NEW (Python escapes such as \n apply).
replace_once() {
  python3 - "$@" <<'PY'
import sys
p, old, new = sys.argv[1], *(a.encode().decode("unicode_escape") for a in sys.argv[2:4])
s = open(p, encoding="utf-8").read()
assert old in s, old
open(p, "w", encoding="utf-8").write(s.replace(old, new, 1))
PY
}

# ---- a checkpoint's index.json with a key given twice ----
# The duplicate repeats "step" with its own value: Python's reading (the last value wins) and
# the index's CRC agree with the file, so only the strict reading finds it.
expect 0 "" --may-write jck -- "$MT" "${J[@]}" --checkpoint-dir jck --checkpoint-every 1
replace_once "$WORK/jck/step_00000002/index.json" '\n  "step": 2,' '\n  "step": 2,\n  "step": 2,'
expect 2 "^meshtrain: checkpoint jck/step_00000002 is corrupt: index.json gives the field \"step\" more than once in the top-level object; delete it" -- \
  "$MT" checkpoint convert --to-single jck/step_00000002 jout.safetensors
rm -rf "$WORK/jck"

# ---- a trace with a key given twice ----
expect 0 "" --may-write jt.json --may-write jt.svg -- "$MT" "${J[@]}" --trace jt.json
replace_once "$WORK/jt.json" '"ph":"X"' '"ph":"X","ph":"B"'
expect 2 "^meshtrain: the trace jt.json gives the field \"ph\" more than once in traceEvents\[[0-9]+\]; keep one value for it" -- \
  "$MT" trace render jt.json -o jdup.svg
rm -f "$WORK/jt.json" "$WORK/jt.svg"
