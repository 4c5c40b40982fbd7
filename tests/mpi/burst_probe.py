"""Rank script: measure the medium's burst (profiler.measure_burst); rank 0 prints it as JSON."""
import json

import numpy as np

from autotune.profiler import measure_burst
from collectives import MPICommunicator

comm = MPICommunicator()
burst = measure_burst(comm, xp=np)
if comm.rank == 0:
    print(json.dumps(burst))
