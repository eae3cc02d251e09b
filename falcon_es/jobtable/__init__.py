"""The upper layer's ``job`` table: reading new rows and requests from it (the inbox),
and the upper layer's own writes the CLI plays (submitting a row, asking for an abort).
Falcon-ES owns none of this table; the mapping in ``falcon_es.config.job_mapping`` says
where its columns are."""
