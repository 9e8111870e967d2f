from tfdp.bench.table import run

run()
