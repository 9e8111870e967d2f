from tfdp.bench.main import run

run()
