"""Configuration: what an operator sets, declared once and read from the environment in
one place; the job-table mapping, the database URLs and the retry policies are part of
it."""
