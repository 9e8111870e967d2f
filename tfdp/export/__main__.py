from tfdp.export.command import run

run()
