"""meshtrain from Python: build or load a model, train it at any layout, read its rows and weights.

    import meshtrain
    model = meshtrain.Model.from_file("examples/models/vgg-mini.json")
    run = meshtrain.train(model, data="fashion-mnist", steps=20, dp=2, pp=2, microbatches=2)
    print(run.metrics[-1]["loss"])
    weights = run.state_dict()          # name -> numpy array, PyTorch's names and layouts

Every call runs the `meshtrain` program's own code in this process: `train` takes every option
of `meshtrain train` under its name with dashes as underscores, and a bad value raises
ValueError with the sentence the program prints. Ranks are C++ threads (the GIL is released
while they train) or, under `mpirun python3 script.py` with backend="mpi", MPI processes.
docs/python.md is the guide.
"""

from ._model import Builder, Model
from ._run import Run, plan, train

__all__ = ["Builder", "Model", "Run", "plan", "train"]
