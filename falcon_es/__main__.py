from falcon_es.cli import run

run()
