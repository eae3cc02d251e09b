"""Storage: the database engines and migrations, Falcon-ES's own tables, the event store
(the ``task_events`` log) and the cluster registry's rows."""
