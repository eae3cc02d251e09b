"""One test module per handler module (``falcon_es.handlers.<module>`` ->
``tests/handlers/test_<module>.py``): each drives that handler alone on the simulated
world through ``tests.support.bench``."""
