"""``python -m attnrank.speed DATASET ROOT K MODE DTYPE N``: one speed cell, its row as JSON on
stdout (:func:`attnrank.speed.timing.measure`; :func:`~attnrank.speed.timing.run_cells` runs each
cell so, in a fresh process)."""

import json
import sys
from pathlib import Path

from ..config import set_torch_threads
from .timing import measure

if __name__ == "__main__":  # one cell: python -m attnrank.speed DATASET ROOT K MODE DTYPE N
    set_torch_threads()
    ds_name, data, k_s, mode_s, dtype_s, n_s = sys.argv[1:7]
    print(json.dumps(measure(ds_name, Path(data), int(k_s), mode_s, dtype_s, int(n_s))))
