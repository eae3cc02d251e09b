"""The engine: the tick contract (``runtime``), what handlers may read (``context``), the
effect executor, the loop, the in-memory views kept on the log (live set, lifecycle
index, cluster cache) and following a log someone else appends to."""
