from modelpool.cli.main import run

run()
