"""Helpers the tests share (no tests here): the lifecycle harness, the per-handler
bench. Imported as ``tests.support.<module>``, as ``tests.fakes`` is."""
