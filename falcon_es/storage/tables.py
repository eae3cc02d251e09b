"""SQLAlchemy Core table definitions shared by the store and the projections.

The migrations in ``schema/`` create Falcon-ES's own tables; this module only describes
them so queries are written once. The job table is the upper layer's: ``JobTable``
describes it under the names of a ``JobMapping`` (the settings), and only the demo,
the tests, the benchmarks and ``db upgrade --create-job-table`` create it from this
definition. Times are stored as naive UTC with microseconds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from falcon_es.config.job_mapping import JOB_COLUMNS, PRIORITY_COLUMNS, JobMapping

metadata = sa.MetaData()

#: DATETIME(6) on MySQL so recorded_at keeps microseconds; SQLite stores text anyway.
Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
#: LONGTEXT-backed JSON on MySQL/MariaDB, TEXT on SQLite.
Json = sa.JSON().with_variant(mysql.JSON(), "mysql", "mariadb")

#: The longest stream id the log holds, so the longest job id Falcon-ES can take in.
STREAM_ID_LENGTH = 64
#: The longest actor Falcon-ES keeps (``last_served.actor``), so the longest job actor
#: it takes in.
ACTOR_LENGTH = 128

task_events = sa.Table(
    "task_events", metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
              autoincrement=False),
    sa.Column("stream_id", sa.String(STREAM_ID_LENGTH), nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("type", sa.String(64), nullable=False),
    sa.Column("schema_version", sa.Integer, nullable=False),
    sa.Column("data", Json, nullable=False),
    sa.Column("meta", Json, nullable=False),
    sa.Column("recorded_at", Timestamp, nullable=False),
    sa.UniqueConstraint("stream_id", "version", name="uq_task_events_stream_version"),
)

#: One row (id=1) holding the last assigned seq. Appenders lock it FOR UPDATE so that
#: seq order is commit order on MySQL too. It also holds the writers' fence: the term
#: of the controller that took it last and who that is (``storage.fence``).
FENCE_HOLDER_LENGTH = 255
log_head = sa.Table(
    "log_head", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("last_seq", sa.BigInteger, nullable=False),
    sa.Column("fence_term", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("fence_holder", sa.String(FENCE_HOLDER_LENGTH), nullable=True),
)

#: Position of each asynchronous consumer (outbox publisher, rebuilt views), and the
#: seq through which ``last_served`` holds every pick (``engine.live_set``).
checkpoints = sa.Table(
    "checkpoints", metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("position", sa.BigInteger, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
)

#: The streams a starting controller folds (``falcon_es.engine.live_set``): every task stream
#: that still holds something (not ended, an open intent, a pool whose fate is open or
#: that waits retained for another task) and every orphan stream with an orphan whose
#: delete is open. Kept in the append's own transaction, so a controller that starts
#: folds these streams instead of the whole log. ``fold_from`` is the first version
#: it reads (1 for a task; an orphan stream's oldest open orphan).
live_streams = sa.Table(
    "live_streams", metadata,
    sa.Column("stream_id", sa.String(64), primary_key=True),
    sa.Column("fold_from", sa.Integer, nullable=False),
)

#: Per (cluster, topology) queue, the actor served last (its latest ``TaskPicked``):
#: the pick rule makes that actor yield, and the task it picked may have left the
#: live set long ago. Written lazily, with the deletes of ``live_streams`` rows, up to a
#: checkpoint: a start reads the picks the log holds after it.
last_served = sa.Table(
    "last_served", metadata,
    sa.Column("cluster_id", sa.String(36), primary_key=True),
    sa.Column("topology", sa.String(32), primary_key=True),
    sa.Column("actor", sa.String(ACTOR_LENGTH), nullable=False),
)

#: The sim backend's world kept beside the log (``falcon_es.adapters.sim.persist``):
#: one row per named world (``seq`` counts its saves, ``snapshot_seq`` is the save the
#: objects table holds, ``moment`` the world's clock at the last save), the compacted
#: snapshot of its objects, and the objects changed by each save since (``blob`` NULL:
#: the object is gone). Written in the controller's commit transaction.
sim_worlds = sa.Table(
    "sim_worlds", metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("seq", sa.BigInteger, nullable=False),
    sa.Column("snapshot_seq", sa.BigInteger, nullable=False),
    sa.Column("moment", Timestamp, nullable=False),
    sa.Column("objects", sa.Integer, nullable=False),
)
#: A pickled world object; LONGBLOB on MySQL/MariaDB (a BLOB stops at 64 KiB).
Blob = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
sim_world_objects = sa.Table(
    "sim_world_objects", metadata,
    sa.Column("world", sa.String(64), primary_key=True),
    sa.Column("key", sa.String(32), primary_key=True),
    sa.Column("kind", sa.String(255), nullable=False),
    sa.Column("blob", Blob, nullable=False),
)
sim_world_changes = sa.Table(
    "sim_world_changes", metadata,
    sa.Column("world", sa.String(64), primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("key", sa.String(32), primary_key=True),
    sa.Column("kind", sa.String(255), nullable=False),
    sa.Column("blob", Blob, nullable=True),
)

clusters = sa.Table(
    "clusters", metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("name", sa.String(128), nullable=False, unique=True),
    sa.Column("project", sa.String(128), nullable=False),
    sa.Column("location", sa.String(64), nullable=False),
    sa.Column("tpu_type", sa.String(32), nullable=False),
    sa.Column("gcs_bucket", sa.String(255), nullable=False),
    sa.Column("default_reservation", sa.String(255), nullable=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("node_location", sa.String(64), nullable=True),
)

#: The columns Falcon-ES reads or writes in the upper layer's job table, and the
#: SQLAlchemy type family each must have (checked by ``falcon-es db check``).
JOB_COLUMN_KINDS: Mapping[str, type[sa.types.TypeEngine]] = MappingProxyType({
    "id": sa.String, "name": sa.String, "actor": sa.String, "spec": sa.JSON,
    "status": sa.String, "reason": sa.String, "message": sa.Text,
    "created_at": sa.DateTime, "updated_at": sa.DateTime, "aborting_at": sa.DateTime,
    "aborted_at": sa.DateTime, "cluster_id": sa.String, "node_pool_name": sa.String,
    "job_uid": sa.String, "dispatched_at": sa.DateTime, "finished_at": sa.DateTime,
})
#: The same for the optional priority request columns (``PRIORITY_COLUMNS``).
PRIORITY_COLUMN_KINDS: Mapping[str, type[sa.types.TypeEngine]] = MappingProxyType({
    "priority": sa.Integer, "priority_requested_at": sa.DateTime,
    "priority_requested_by": sa.String,
})

#: Falcon-ES's definition of each job column (type, nullable), used where Falcon-ES
#: creates the table itself and to type the values it binds.
_JOB_DEFINITION: Mapping[str, tuple[sa.types.TypeEngine, bool]] = MappingProxyType({
    "id": (sa.String(STREAM_ID_LENGTH), False),
    "name": (sa.String(255), False),
    "actor": (sa.String(128), False),
    "spec": (Json, True),
    "status": (sa.String(32), False),
    "reason": (sa.String(64), True),
    "message": (sa.Text(), True),
    "created_at": (Timestamp, False),
    "updated_at": (Timestamp, True),
    "aborting_at": (Timestamp, True),
    "aborted_at": (Timestamp, True),
    "cluster_id": (sa.String(36), True),
    "node_pool_name": (sa.String(64), True),
    "job_uid": (sa.String(64), True),
    "dispatched_at": (Timestamp, True),
    "finished_at": (Timestamp, True),
})
_PRIORITY_DEFINITION: Mapping[str, tuple[sa.types.TypeEngine, bool]] = MappingProxyType({
    "priority": (sa.Integer(), True),
    "priority_requested_at": (Timestamp, True),
    "priority_requested_by": (sa.String(128), True),
})


@dataclasses.dataclass(frozen=True)
class MessageRoom:
    """What the job table's ``message`` column holds: at most ``chars`` characters
    (a ``VARCHAR(n)``; None: no such limit) and ``octets`` UTF-8 bytes. The default is a
    MySQL ``TEXT``, 65,535 bytes, the column Falcon-ES creates; a longer value would be
    cut by the server mid-character or refused."""

    chars: int | None = None
    octets: int = 65_535


@dataclasses.dataclass(frozen=True)
class WantedIndex:
    """An index the queries Falcon-ES runs on the job table want: its leading columns
    (Falcon-ES's names) and the queries it serves."""

    columns: tuple[str, ...]
    serves: str


#: Derived from the statements themselves: ``inbox.py`` (the poll, the scan for rows it
#: cannot take), ``falcon_es/projections/job_table.py`` and ``falcon_es/projections/queues.py`` (every write
#: is by id), ``job_rows.py`` (``task`` commands).
WANTED_INDEXES: tuple[WantedIndex, ...] = (
    WantedIndex(("id",), "every row Falcon-ES writes (Status/Reason/Message, position "
                         "Messages) and every abort: WHERE id = ?"),
    WantedIndex(("status", "reason"), "the poll of every tick: new rows (status = 'Pending' "
                                      "AND reason IS NULL) and abort requests (status = "
                                      "'Aborting'); the scan for unknown statuses"),
    WantedIndex(("created_at",), "the scan of recent rows Falcon-ES never took in "
                                 "(created_at >= ?); task list order"),
)
#: Wanted when the table has the priority request columns.
PRIORITY_INDEXES: tuple[WantedIndex, ...] = (
    WantedIndex(("priority_requested_at",), "the poll of every tick for priority change "
                                            "requests (priority_requested_at > ?)"),
)


@dataclasses.dataclass(frozen=True)
class JobSql:
    """The job table's names quoted for one dialect, for statements written as SQL
    text (the bulk writes of the hot path): ``table`` qualified with its database when
    it has one, ``columns`` by Falcon-ES's names."""

    table: str
    columns: Mapping[str, str]

    def __hash__(self) -> int:
        # The statements written from these names are cached by them.
        return hash((self.table, tuple(self.columns.items())))


class JobTable:
    """The upper layer's job table under the names of a ``JobMapping``.

    ``table.c`` (also ``c``) is keyed by Falcon-ES's column names whatever the table
    calls them, so statements built on it are written once; a select's result columns
    carry the table's names unless labelled, so readers label what they read.
    Indexes are those of ``WANTED_INDEXES`` (created only where Falcon-ES creates the
    table itself)."""

    def __init__(self, mapping: JobMapping = JobMapping(),
                 message_room: MessageRoom = MessageRoom()) -> None:
        self.mapping = mapping
        #: How long a Message the table's column takes (``db.message_room`` reads it).
        self.message_room = message_room
        definition = dict(_JOB_DEFINITION)
        if mapping.priority_requests:
            definition.update(_PRIORITY_DEFINITION)
        columns = [
            sa.Column(mapping.column(name), kind, key=name, nullable=nullable,
                      primary_key=name == "id")
            for name, (kind, nullable) in definition.items()
        ]
        self.table = sa.Table(mapping.table, sa.MetaData(), *columns, schema=mapping.schema)
        for wanted in self.wanted_indexes:
            if wanted.columns != ("id",):
                sa.Index(self.index_name(wanted), *(self.table.c[c] for c in wanted.columns))
        self.c = self.table.c
        self._sql: dict[str, JobSql] = {}

    @property
    def wanted_indexes(self) -> tuple[WantedIndex, ...]:
        """The indexes Falcon-ES's queries want on this table."""
        return (*WANTED_INDEXES, *PRIORITY_INDEXES) if self.mapping.priority_requests \
            else WANTED_INDEXES

    @property
    def column_kinds(self) -> Mapping[str, type[sa.types.TypeEngine]]:
        """Every column Falcon-ES uses here and the type family it must have."""
        if not self.mapping.priority_requests:
            return JOB_COLUMN_KINDS
        return MappingProxyType({**JOB_COLUMN_KINDS, **PRIORITY_COLUMN_KINDS})

    def index_name(self, wanted: WantedIndex) -> str:
        """``ix_<table>_<columns>`` in the table's names (``ix_job_status_reason`` by
        default), cut to MySQL's 64 characters."""
        names = "_".join(self.mapping.column(c) for c in wanted.columns)
        return f"ix_{self.mapping.table}_{names}"[:64]

    def sql(self, dialect: sa.Dialect) -> JobSql:
        """The names quoted for ``dialect`` (computed once per dialect)."""
        names = self._sql.get(dialect.name)
        if names is None:
            preparer = dialect.identifier_preparer
            names = JobSql(
                table=preparer.format_table(self.table),
                columns=MappingProxyType(
                    {name: preparer.quote(self.mapping.column(name)) for name in JOB_COLUMNS}),
            )
            self._sql[dialect.name] = names
        return names
