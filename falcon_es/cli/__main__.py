"""``python -m falcon_es.cli``: the same command line as ``python -m falcon_es``."""

from falcon_es.cli import run

run()
