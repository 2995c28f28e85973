"""Reading a run into one typed Spark DataFrame of well-formed events (explicit schema), counting the rest.

JSON lines are parsed in the JVM (`try_parse_json` into a VARIANT) and every required field is checked
for its exact JSON type with `schema_of_variant`, so a string where an int is required, `5.0` for an int,
`1` for a bool, `null`, a list holding a number, or a missing field all make the line malformed, as
EVENTS.md says; Spark's JSON reader would coerce some of those silently. The order of events is kept as
(`ts_ms`, `fidx` = rank of the file's relative path, `blk` = byte offset of the file split, `rid` = row
id within the split), which sorts like (ts_ms, path, line number).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from rmqlab.pipeline.contract import (
    ALL_FIELDS,
    BOOL,
    CID_ALL,
    CID_ALL_DIGEST,
    COMMON_FIELDS,
    DIGEST_PATTERN,
    EVENT_FIELDS,
    INT,
    MEMBERS_EVENT,
    NEMESIS_GROUP_ROLE,
    OPTIONAL_FIELDS,
    STR,
    STR_LIST,
    FieldType,
)
from rmqlab.pipeline.discover import RunDir, RunDirError, RunFile, discover

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

ORDER_COLUMNS = ("ts_ms", "fidx", "blk", "rid")
# The fields the analysis reads (the Parquet copy keeps them all).
ANALYSIS_COLUMNS = (
    "ts_ms",
    "event",
    "node",
    "group",
    "client_id",
    "msg_id",
    "topic",
    "broker",
    "queue_id",
    "queue_offset",
    "started_ms",
    "mode",
    "queues",
    "cid_all",
    "cid_all_digest",
    "action",
    "target",
    "pull",  # an `assignment`'s queues (RocketMQ 5)
    "pop",
    "offset",  # the committed offsets (offset regressions)
    "prev_offset",  # a slave's offset before its sync replaced it
    "next_offset",
)
INGEST_META = "_ingest.json"
# From this many bytes of event files the read lines are held in Spark's compressed columnar cache,
# below it as a local checkpoint of rows. Measured with the default 2 GB driver: at 250 MB (1 M lines)
# the checkpoint costs less, at 1.25 GB (5 M lines) its rows spill to disk and the cache costs less.
CACHE_FROM_BYTES = 512 * 2**20

_SPARK_TYPES = {INT: "bigint", STR: "string", BOOL: "boolean", STR_LIST: "array<string>"}
# Names schema_of_variant gives for values of each contract type.
_VARIANT_TYPES = {INT: ("BIGINT", "INT", "SMALLINT", "TINYINT"), STR: ("STRING",), BOOL: ("BOOLEAN",)}


def event_schema() -> StructType:
    """The explicit schema of the typed event table (also the Parquet copy's schema)."""
    from pyspark.sql.types import (
        ArrayType,
        BooleanType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    spark_types = {INT: LongType(), STR: StringType(), BOOL: BooleanType(), STR_LIST: ArrayType(StringType())}
    fields = [StructField(name, spark_types[ftype]) for name, ftype in ALL_FIELDS.items()]
    fields += [
        StructField("fidx", IntegerType()),
        StructField("blk", LongType()),
        StructField("rid", LongType()),
    ]
    return StructType(fields)


@dataclass
class RunStats:
    """Counts of a run's event lines and its time span."""

    events: int
    malformed_lines: int
    start_ms: int | None
    end_ms: int | None


def _sql_str(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _exact_type_check(name: str, ftype: FieldType) -> str:
    """SQL: field `name` of variant `v` (the whole line) has exactly the contract type."""
    kind = f"schema_of_variant(variant_get(v, '$.{name}', 'variant'))"
    if ftype is STR_LIST:
        # ARRAY<VOID> is an empty list (or a list of nulls, which the null check then rejects).
        return (
            f"(coalesce({kind} IN ('ARRAY<STRING>', 'ARRAY<VOID>'), false) AND "
            f"NOT exists(try_variant_get(v, '$.{name}', 'array<string>'), x -> x IS NULL))"
        )
    names = ", ".join(_sql_str(n) for n in _VARIANT_TYPES[ftype])
    return f"coalesce({kind} IN ({names}), false)"


def _fast_column(name: str) -> str:
    """The column of field `name` as Spark's JSON reader read it (the fast path)."""
    return f"`j_{name}`"


def _fast_type_check(name: str, ftype: FieldType) -> str:
    """SQL: field `name` of struct `j` (from_json with the contract types) is present and not null.

    On the fast path that is the whole check: Spark's JSON reader is strict for ints and bools (a
    string, `5.0`, `true` or an out-of-range number gives null), and lines whose string fields could
    be the text of some other JSON value were routed to the exact path (see _ANY_LOOKS_NON_STRING).
    """
    return f"({_fast_column(name)} IS NOT NULL)"


def _member_field_ok(check: Any, name: str) -> str:
    """SQL: the member-set field `name` of a rebalance line is usable (a list of strings for cid_all,
    64 lowercase hex characters for cid_all_digest)."""
    if name == CID_ALL:
        return check(CID_ALL, STR_LIST)
    value = _value(check, CID_ALL_DIGEST, STR)
    return f"({check(CID_ALL_DIGEST, STR)} AND {value} RLIKE '{DIGEST_PATTERN}')"


# Event names by number: the fast path tests a line's event as a number (`ev_id`, 0 for events outside the
# table), which keeps its generated code small; the exact path tests the name (`ev`).
_EVENT_IDS = {name: i for i, name in enumerate(EVENT_FIELDS, start=1)}


def _is_event(check: Any, *names: str) -> str:
    """SQL: the line's event is one of `names` (read the way `check` reads the line)."""
    if not names:
        return "false"
    if check is _fast_type_check:
        return f"ev_id IN ({', '.join(str(_EVENT_IDS[n]) for n in names)})"
    return f"ev IN ({', '.join(_sql_str(n) for n in names)})"


def _event_id(event: Any) -> Any:
    """The number of the fast path's event name (`_EVENT_IDS`), 0 when it is not in the table."""
    import pyspark.sql.functions as F

    number = F.lit(0)
    for name, i in reversed(_EVENT_IDS.items()):
        number = F.when(event == name, i).otherwise(number)
    return number


def _validity_sql(check: Any) -> str:
    """Well-formedness of a line by EVENTS.md, given a per-field check (columns `ev` or `ev_id`,
    `role_is_consumer`)."""
    common = " AND ".join(check(n, t) for n, t in COMMON_FIELDS.items())
    cases = []
    for name, fields in EVENT_FIELDS.items():
        checks = [check(n, t) for n, t in fields.items()]
        if name == "nemesis":
            checks.append(f"(NOT role_is_consumer OR {check('group', STR)})")
        if name == MEMBERS_EVENT:
            checks.append(
                f"({_member_field_ok(check, CID_ALL)} OR {_member_field_ok(check, CID_ALL_DIGEST)})"
            )
        cases.append(f"WHEN {_is_event(check, name)} THEN {' AND '.join(checks)}")
    return f"({common} AND CASE {' '.join(cases)} ELSE true END)"


def _value(check: Any, name: str, ftype: FieldType) -> str:
    """SQL for a field's typed value, read the way `check` reads the line."""
    if check is _fast_type_check:
        return _fast_column(name)
    return f"try_variant_get(v, '$.{name}', '{_SPARK_TYPES[ftype]}')"


def _value_sql(check: Any, name: str, ftype: FieldType) -> str:
    """The typed value of a field read the way `check` reads the line, only for events that require
    it (other fields on a line are ignored)."""
    value = _value(check, name, ftype)
    if name in COMMON_FIELDS:
        return value
    if name in (CID_ALL, CID_ALL_DIGEST):
        members = _is_event(check, MEMBERS_EVENT)
        return f"CASE WHEN {members} AND {_member_field_ok(check, name)} THEN {value} END"
    cond = _is_event(check, *[e for e, fields in EVENT_FIELDS.items() if name in fields])
    optional = [e for e, fields in OPTIONAL_FIELDS.items() if name in fields]
    if optional:  # read only when of its type: a wrong one is ignored, as a missing one
        cond = f"({cond} OR ({_is_event(check, *optional)} AND {check(name, ftype)}))"
    if name == "group":
        cond = f"({cond} OR ({_is_event(check, 'nemesis')} AND role_is_consumer))"
    return f"CASE WHEN {cond} THEN {value} END"


# A line whose only '}' is its last character cannot hide a second value after the object; other
# lines are checked by parsing them wrapped in a JSON array. Trailing white space is rare, so the
# trimmed copy is only made when the line does not end with '}'. The first '}' is found by bytes
# (substring_index, octet_length): instr and length count characters, which cost a scan of the
# whole line each.
_TRIMMED = "trim(TRAILING ' \t' FROM value)"
_ONE_VALUE = "coalesce(json_array_length('[' || value || ']') = 1, false)"
_BEFORE_FIRST_BRACE = "octet_length(substring_index(value, '}', 1))"
_SHAPE_SQL = (
    f"(CASE WHEN endswith(value, '}}') THEN ({_BEFORE_FIRST_BRACE} = octet_length(value) - 1 "
    f"OR {_ONE_VALUE}) ELSE (endswith({_TRIMMED}, '}}') AND "
    f"({_BEFORE_FIRST_BRACE} = octet_length({_TRIMMED}) - 1 "
    f"OR {_ONE_VALUE})) END)"
)
_FAST_SCHEMA = (
    ", ".join(f"`{n}` {_SPARK_TYPES[t]}" for n, t in ALL_FIELDS.items()) + ", _corrupt_record string"
)
# Spark's JSON reader turns a number, bool, object or array into its JSON text when a string is
# expected. Text of that shape (a JSON number, true, false, starting with '{' or '[', or with '"' as
# Infinity is written) is therefore ambiguous, and such lines take the exact path. Real strings
# rarely look like that (hex msg ids with leading zeros or letters are not JSON numbers).
_JSON_NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?"
# Every string field and list element of a line, joined by NUL after a leading NUL, a null list element
# written as \x01 (neither can be in a string of a line on the fast path: raw control characters are
# not valid JSON, and escaped ones are \u escapes): a null element, or a field or element that is a JSON
# number, true or false, or that starts like a string, list or object. One regex over one joined
# string, not a check per field, keeps the line's checks small methods for the JIT.
_ANY_LOOKS_NON_STRING = "\x01|\x00(" + _JSON_NUMBER + '|true|false)(\x00|$)|\x00["\\[{]'


# The first characters of the text of a JSON number, true, false, string, list or object. A string field
# that starts otherwise cannot match _ANY_LOOKS_NON_STRING, so it is left out of the joined string: the
# regex then scans the few fields that may match (client and message ids start with digits) rather than
# every field of the line (at 1 M lines 5.7 against 6.8 s of JVM CPU for this test alone).
_SUSPECT_FIRST = tuple(ord(c) for c in '-0123456789tf"[{')


def _ambiguous(j: Any) -> Any:
    """Some string field of struct `j` (the JSON reader's) could be the text of a non-string JSON value."""
    import pyspark.sql.functions as F

    parts = []
    for name, ftype in ALL_FIELDS.items():
        if ftype is STR:
            field = j.getField(name)
            parts.append(F.when(F.ascii(field).isin(*_SUSPECT_FIRST), field))
        elif ftype is STR_LIST:
            parts.append(F.array_join(j.getField(name), "\x00", "\x01"))
    # concat_ws skips null fields; the leading '' puts a NUL before the first field.
    return F.coalesce(F.concat_ws("\x00", F.lit(""), *parts).rlike(_ANY_LOOKS_NON_STRING), F.lit(False))


# Strict JSON: no single quotes, no NaN/Infinity (Python's json and parse_json reject them too).
_FAST_OPTIONS = {"mode": "PERMISSIVE", "allowSingleQuotes": "false", "allowNonNumericNumbers": "false"}


def file_map(spark: SparkSession, files: list[RunFile], spark_paths: list[str], runs: list[int]) -> DataFrame:
    """(file_path, fidx, run) for every file; fidx = rank of the file's relative path in its run (files
    come sorted by run, then relative path), run = the index of its run.

    `spark_paths` are the reader's `inputFiles()`: URL-encoded URIs like `_metadata.file_path`, though
    not always with the same number of slashes after the scheme, so every file gets a row for each
    spelling and the lines join on their `_metadata.file_path` as it is (no string work per line).
    """
    by_local = {unquote(urlsplit(p).path): p for p in spark_paths}
    rows = []
    for fidx, (run_file, run) in enumerate(zip(files, runs, strict=True)):
        spelled = by_local.get(run_file.path)
        if spelled is None:
            raise RuntimeError(f"internal error: Spark does not list event file {run_file.rel!r}")
        rows.extend((spelling, fidx, run) for spelling in _spellings(spelled))
    return spark.createDataFrame(rows, "file_path string, fidx int, run int")


def _spellings(uri: str) -> list[str]:
    """The URI with zero to three slashes after its scheme (`file:/x`, `file:///x`, ...), or as it is
    when it has no scheme."""
    if ":" not in uri:
        return [uri]
    scheme, rest = uri.split(":", 1)
    bare = rest.lstrip("/")
    return [f"{scheme}:{slashes}{bare}" for slashes in ("", "/", "//", "///")]


def _run_prefix() -> Any:
    """The column `run_prefix`: the prefix of the names of the line's run (see RUN_SEP)."""
    import pyspark.sql.functions as F

    return F.concat(F.col("run").cast("string"), F.lit(RUN_SEP)).alias("run_prefix")


def _qualified(name: str) -> Any:
    """Column `name`, prefixed with its run's prefix (column `run_prefix`) when it is one of the names
    that key a computation (see RUN_SEP)."""
    import pyspark.sql.functions as F

    if name in QUALIFIED_COLUMNS:
        return F.concat(F.col("run_prefix"), F.col(name)).alias(name)
    return F.col(name)


def _typed(
    rows: DataFrame,
    check: Any,
    wanted: dict[str, FieldType],
    ok: str,
    qualify: bool,
    *,
    keep_text: bool = False,
) -> DataFrame:
    """`rows` (with `value`, `j` or `v`, `ev`, `role_is_consumer`) as `ok` (SQL) and the typed values
    read the way `check` reads a line (null unless `ok`), the order columns and `run`; names qualified
    by run when `qualify`; with `keep_text`, the text of the lines whose `ok` is null as `value`."""
    import pyspark.sql.functions as F

    # Only what the values read passes on with `ok`: Spark then generates the values' projection as a
    # method of its own (it splits the generated code between two operators when the second reads all
    # of the first's output), which keeps each method within the JIT's limit.
    if check is _fast_type_check:
        read = [_fast_column(n).strip("`") for n in {**wanted, CID_ALL: STR_LIST, CID_ALL_DIGEST: STR}]
        read += ["ev_id"]
    else:
        read = ["v", "ev"]
    read += ["role_is_consumer", "fidx", "blk", "rid", "run", *(["value"] if keep_text else [])]
    judged = rows.select(F.expr(ok).alias("ok"), *read, *(["run_prefix"] if qualify else []))
    values = [
        F.when(F.col("ok"), F.expr(_value_sql(check, name, ftype))).alias(name)
        for name, ftype in wanted.items()
    ]
    text = [F.when(F.col("ok").isNull(), F.col("value")).alias("value")] if keep_text else []
    typed = judged.select(
        "ok", *values, "fidx", "blk", "rid", "run", *text, *(["run_prefix"] if qualify else [])
    )
    if not qualify:
        return typed
    return typed.select(*[_qualified(c) for c in typed.columns if c != "run_prefix"])


def _role_is_consumer(check: Any) -> Any:
    import pyspark.sql.functions as F

    role = _value(check, "target_role", STR)
    return F.expr(f"coalesce({role} = {_sql_str(NEMESIS_GROUP_ROLE)}, false)").alias("role_is_consumer")


def _read_lines(
    spark: SparkSession,
    files: list[RunFile],
    columns: tuple[str, ...] | None,
    runs: list[int] | None,
    *,
    fast_path: bool,
    qualify: bool,
) -> tuple[DataFrame, tuple[DataFrame, ...]]:
    """(lines, stores): the typed lines as `parse_lines` describes them, and the two stores they are read
    from (to free when done).

    The first store (a cache or a local checkpoint by input size, see CACHE_FROM_BYTES) holds every line
    decided by the fast path with its typed values, and the text of every other line; the second, a
    local checkpoint, the typed values of those others, decided by the exact path.
    Two projections instead of one with both paths keep the generated method of the fast path small
    enough for the JIT (one method of both paths was about 40 KB of bytecode, five times the JIT's
    limit of 8,000 bytes, so it ran interpreted), and the exact path's code runs only for the lines
    that need it, once.
    """
    import pyspark.sql.functions as F
    from pyspark.storagelevel import StorageLevel

    reader = spark.read.text([f.path for f in files])
    files_of_lines = file_map(spark, files, reader.inputFiles(), runs or [0] * len(files))
    lines = reader.select(
        "value",
        F.col("_metadata.file_path").alias("file_path"),
        F.col("_metadata.file_block_start").alias("blk"),
        F.monotonically_increasing_id().alias("rid"),
    )
    lines = lines.join(F.broadcast(files_of_lines), "file_path", "left")
    # Blank lines are skipped; the regex only runs for lines that start with white space.
    blank = "(value = '' OR (ascii(value) IN (9, 11, 12, 32) AND value RLIKE '^\\\\s*$'))"
    lines = lines.where(f"NOT {blank}")
    # What the text alone decides, before the JSON reader: one object on the line, a \u escape.
    lines = lines.select(
        "*",
        F.expr(f"coalesce({_SHAPE_SQL}, false)").alias("one_object"),
        F.expr("contains(value, '\\\\u')").alias("escaped"),
    )
    # Fast path: Spark's JSON reader (strict options, required fields typed) decides lines that parse
    # cleanly and carry no \u escape (it does not check surrogate pairs). Everything else (syntax
    # errors, duplicate keys with a bad first value, escapes) is decided by the exact path: the line
    # as a VARIANT and the JSON type of every required field.
    # Every field as a column of its own, read once: the checks below read fields many times, and
    # reading one out of the struct each time made their generated code several times larger. (The
    # one from_json is computed once per line: Spark eliminates the common subexpression.)
    j = F.from_json("value", _FAST_SCHEMA, _FAST_OPTIONS)
    parsed_cleanly = j.isNotNull() & j.getField("_corrupt_record").isNull()
    fast = (
        F.coalesce(parsed_cleanly & ~F.col("escaped") & ~_ambiguous(j), F.lit(False))
        if fast_path
        else F.lit(False)
    )
    with_j = lines.select(
        "value", "run", "fidx", "blk", "rid", "one_object", "escaped",
        *[j.getField(name).alias(f"j_{name}") for name in ALL_FIELDS],
        _event_id(j.getField("event")).alias("ev_id"),
        *([_run_prefix()] if qualify else []),
        F.coalesce(j.getField("target_role") == NEMESIS_GROUP_ROLE, F.lit(False)).alias("role_is_consumer"),
        fast.alias("fast"),
    )  # fmt: skip
    wanted = ALL_FIELDS if columns is None else {name: ALL_FIELDS[name] for name in columns}
    routed = with_j
    # One pass over the text: `ok` and the typed values of the lines the fast path decides, the text of
    # the others (`ok` null), materialised together.
    ok_fast = f"CASE WHEN fast THEN coalesce(one_object AND {_validity_sql(_fast_type_check)}, false) END"
    routed = _typed(routed, _fast_type_check, wanted, ok_fast, qualify, keep_text=True)
    if sum(os.path.getsize(f.path) for f in files) >= CACHE_FROM_BYTES:
        # Spark's compressed columnar cache, filled by the exact path's job below: at 5 M lines it cost
        # less JVM CPU in all than a local checkpoint of the same rows (whose uncompressed rows did not
        # fit the driver's memory, and went partly to disk), and the metrics read only their columns.
        routed = routed.persist(StorageLevel.MEMORY_AND_DISK)
    else:
        # Rows that fit in memory: cheaper to build than the columnar cache (1 M lines: 35.0 against
        # 40.3 s of JVM CPU for the whole analysis).
        routed = routed.localCheckpoint(eager=True)
    exact = (
        routed.where("ok IS NULL")
        .select(
            "value",
            "fidx",
            "blk",
            "rid",
            "run",
            F.expr("try_parse_json(value)").alias("v"),
            *([_run_prefix()] if qualify else []),
        )
        .select("*", F.expr(_value(_exact_type_check, "event", STR)).alias("ev"), _role_is_consumer(None))
    )
    ok_exact = f"coalesce({_SHAPE_SQL} AND v IS NOT NULL AND {_validity_sql(_exact_type_check)}, false)"
    # The exact path's names are qualified here, the fast path's were when materialised.
    exact_rows = _typed(exact, _exact_type_check, wanted, ok_exact, qualify).localCheckpoint(eager=True)
    return routed.where("ok IS NOT NULL").drop("value").unionByName(exact_rows), (routed, exact_rows)


def parse_lines(
    spark: SparkSession,
    files: list[RunFile],
    columns: tuple[str, ...] | None = None,
    runs: list[int] | None = None,
    *,
    fast_path: bool = True,
) -> DataFrame:
    """Every non-blank line of the files as a row: `ok` (well-formed), the typed fields (only `columns`,
    all when None; validation always looks at every required field), the order columns and `run` (the
    index of the file's run in `runs`, one per file; all 0 when None). `fast_path` False sends every
    line through the exact path (the tests compare the two). The lines are read once, eagerly, into
    the stores that the returned DataFrame reads."""
    return _read_lines(spark, files, columns, runs, fast_path=fast_path, qualify=False)[0]


@dataclass
class LoadedRun:
    """Well-formed events of a run (a cached Spark DataFrame) and the run's line statistics."""

    events: DataFrame
    stats: RunStats
    cached: tuple[DataFrame, ...]

    def release(self) -> None:
        free(*self.cached)


def free(*frames: DataFrame) -> None:
    """Free cached or locally checkpointed DataFrames (best effort: Spark frees them anyway once
    they are no longer referenced). Blocking: a removal still under way when the session stops right
    after (rmq-analyze's last step) has its futures rejected, and Spark prints their stack traces."""
    for df in frames:
        try:
            plan = df._jdf.queryExecution().analyzed()
            if plan.getClass().getSimpleName() == "LogicalRDD":
                plan.rdd().unpersist(True)
            else:
                df.unpersist(blocking=True)
        except Exception:  # nothing to free is not an error
            pass


def load_json_run(
    spark: SparkSession, run_dir: str | os.PathLike[str], columns: tuple[str, ...] | None = ANALYSIS_COLUMNS
) -> LoadedRun:
    """Parse a JSON-lines run directory once, cache the typed well-formed events (only `columns`, all
    when None) and count the lines."""
    import pyspark.sql.functions as F

    files = discover(run_dir)
    if not files:
        raise RunDirError(f"no *.jsonl event files under {os.fspath(run_dir)!r}")
    parsed, routed = _read_lines(spark, files, columns, None, fast_path=True, qualify=False)
    row = parsed.agg(
        F.count_if("ok").alias("events"),
        F.count_if(~F.col("ok")).alias("malformed"),
        F.min(F.when(F.col("ok"), F.col("ts_ms"))).alias("start"),
        F.max(F.when(F.col("ok"), F.col("ts_ms"))).alias("end"),
        F.count_if(F.col("fidx").isNull()).alias("unmapped"),
    ).first()
    assert row is not None
    if row["unmapped"]:
        raise RuntimeError("internal error: some lines could not be mapped to their event file")
    stats = RunStats(int(row["events"]), int(row["malformed"]), row["start"], row["end"])
    return LoadedRun(parsed.where("ok").drop("ok"), stats, routed)


# Many runs in one table: every name that keys a computation (group, client id, node, nemesis target,
# topic) is qualified with its run as "<run index>\x1f<name>", so every window, aggregate and join of
# the metrics is per run with no code of its own; the summaries strip the prefix again.
RUN_SEP = "\x1f"
QUALIFIED_COLUMNS = ("group", "client_id", "topic", "node", "target")


def run_prefix(index: int) -> str:
    """The prefix of the names of run number `index` in a table of many runs."""
    return f"{index}{RUN_SEP}"


@dataclass
class LoadedRuns:
    """Well-formed events of many runs (names qualified, see RUN_SEP) and each run's line statistics
    by run prefix."""

    events: DataFrame
    stats: dict[str, RunStats]
    cached: tuple[DataFrame, ...]

    def release(self) -> None:
        free(*self.cached)


def load_json_runs(
    spark: SparkSession, runs: list[RunDir], columns: tuple[str, ...] = ANALYSIS_COLUMNS
) -> LoadedRuns:
    """Parse the event files of many runs in one pass, cache the typed well-formed events with their
    names qualified by run, and count every run's lines (one small aggregate per run)."""
    import pyspark.sql.functions as F

    files: list[RunFile] = []
    owners: list[int] = []
    for index, run in enumerate(runs):
        files.extend(run.files)
        owners.extend([index] * len(run.files))
    parsed, routed = _read_lines(spark, files, columns, owners, fast_path=True, qualify=True)
    rows = (
        parsed.groupBy("run")
        .agg(
            F.count_if("ok").alias("events"),
            F.count_if(~F.col("ok")).alias("malformed"),
            F.min(F.when(F.col("ok"), F.col("ts_ms"))).alias("start"),
            F.max(F.when(F.col("ok"), F.col("ts_ms"))).alias("end"),
            F.count_if(F.col("fidx").isNull()).alias("unmapped"),
        )
        .collect()
    )
    stats = {run_prefix(i): RunStats(0, 0, None, None) for i in range(len(runs))}
    for row in rows:
        if row["unmapped"] or row["run"] is None:
            raise RuntimeError("internal error: some lines could not be mapped to their event file")
        stats[run_prefix(row["run"])] = RunStats(
            int(row["events"]), int(row["malformed"]), row["start"], row["end"]
        )
    return LoadedRuns(parsed.where("ok").drop("ok"), stats, routed)


def check_parquet_copy(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The statistics recorded by `ingest` in a Parquet copy; RunDirError when it is not one."""
    meta_path = Path(path) / INGEST_META
    if not meta_path.is_file():
        raise RunDirError(
            f"{os.fspath(path)!r} is not a Parquet copy made by 'rmq-analyze ingest' (no {INGEST_META})"
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        int(meta["events"]), int(meta["malformed_lines"])
    except (ValueError, KeyError, TypeError) as exc:
        raise RunDirError(f"{os.fspath(meta_path)!r} is damaged: {exc}") from exc
    return meta


def load_parquet_run(
    spark: SparkSession, path: str | os.PathLike[str], columns: tuple[str, ...] | None = ANALYSIS_COLUMNS
) -> LoadedRun:
    """Events of a Parquet copy written by `ingest` (cached), with the statistics recorded at ingest."""
    from pyspark.storagelevel import StorageLevel

    root = Path(path)
    meta = check_parquet_copy(root)
    events = spark.read.schema(event_schema()).parquet(str(root))
    if columns is not None:
        events = events.select(*columns, "fidx", "blk", "rid")
    events = events.persist(StorageLevel.MEMORY_AND_DISK)
    stats = RunStats(
        int(meta["events"]), int(meta["malformed_lines"]), meta.get("start_ms"), meta.get("end_ms")
    )
    return LoadedRun(events, stats, (events,))


def write_parquet(events: DataFrame, stats: RunStats, out: str | os.PathLike[str], source: str) -> None:
    """The Parquet copy: one folder per event name, plus `_ingest.json` (Spark skips '_' files)."""
    schema_names = [f.name for f in event_schema().fields]
    events.select(*schema_names).write.mode("overwrite").partitionBy("event").parquet(os.fspath(out))
    meta: dict[str, Any] = {"source": source, **asdict(stats)}
    Path(out, INGEST_META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
