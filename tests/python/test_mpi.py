"""The Python module under MPI (docs/python.md, "Threads, the GIL and MPI"): started by
`mpirun -np 2 python3 test_mpi.py BUILD_DIR CHECKPOINT_DIR`, every process makes the same
meshtrain.train(..., backend="mpi", dp=2) call; world rank 0 gets the rows (and on_step's
calls), rank 1 none; the state dict is read back from the shared checkpoint directory.
Exit 77 (ctest's skip) when the module was not built or NumPy is absent.
"""

import os
import sys

try:
    import numpy as np  # noqa: F401
    import meshtrain
    from meshtrain import _meshtrain  # noqa: F401
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)

STEPS = 2
ckpt = sys.argv[2]
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
net = (meshtrain.Builder("mpi-net", image=(1, 28, 28), classes=10, batch=8)
       .conv2d("conv", out_channels=4, kernel_size=3, padding=1).batchnorm2d("bn").relu("relu")
       .maxpool2d("pool", kernel_size=2).flatten("flat").linear("fc", out_features=10).build())
rows = []
run = meshtrain.train(net, data="fashion-mnist", steps=STEPS, dp=2, backend="mpi", threads=1, eval_batches=1,
                      data_order="sequential", checkpoint_dir=ckpt, quiet=True, on_step=rows.append)
if rank == 0:
    assert len(rows) == STEPS and [r["step"] for r in run.metrics] == [1, 2], run.metrics
    sd = run.state_dict()
    assert int(sd["bn.num_batches_tracked"]) == STEPS and sd["fc.weight"].shape == (10, 4 * 14 * 14), list(sd)
    print("rank 0 losses", run.losses)
    print("PYTHON MPI OK")
else:
    assert rows == [] and run.metrics == [], run.metrics
