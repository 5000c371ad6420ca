#!/usr/bin/env python3
"""The named models from their files give the loss curves recorded from the binary of the commit
before they were files (made by record_named_curves.sh: the image models in
tests/model/named_curves.json, from 2dcd77c; the token models in named_token_curves.json, from
8d5ccca): 20 steps at every layout recorded. A run whose float order a later change altered on
purpose is recorded again, with the reason under "rerecorded" in the file. The third argument picks the family. Bit for bit on a CPU with the recorded instruction sets
(oneDNN picks its kernels by them); elsewhere within 1e-5 relative, and the test says so."""
import json
import subprocess
import sys

binary, here, family = sys.argv[1], sys.argv[2], sys.argv[3]
recorded = json.load(open(f"{here}/{'named_curves' if family == 'image' else 'named_token_curves'}.json"))
out = subprocess.run([f"{here}/record_named_curves.sh", binary, family], check=True, capture_output=True,
                     text=True).stdout
now = json.loads(out)
exact = now["cpu_flags"] == recorded["cpu_flags"]
print(f"cpu flags here: {now['cpu_flags']!r}; recorded on: {recorded['cpu_flags']!r}: "
      + ("comparing bit for bit" if exact else "different kernels: comparing within 1e-5 relative"))
failed = 0
for run, old in recorded["curves"].items():
    new = now["curves"].get(run)
    if new is None or len(new) != len(old):
        print(f"FAIL {run}: {len(old)} recorded steps, {0 if new is None else len(new)} now")
        failed += 1
        continue
    bad = [(i + 1, a, b) for i, (a, b) in enumerate(zip(old, new))
           if (a != b if exact else abs(a - b) > 1e-5 * abs(a))]
    print(("FAIL " if bad else "ok   ") + f"{run}: {len(old)} steps" + (f", first difference at step {bad[0]}" if bad else ""))
    failed += bool(bad)
sys.exit(1 if failed else 0)
