"""The examples a run trains on: each source kind prepared once into the array cache behind one
table (``sources``), and the batches of a run in an order of (seed, epoch) only (``pipeline``)."""
