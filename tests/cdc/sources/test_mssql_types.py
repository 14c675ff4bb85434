"""SQL Server types to values and JSON, and driver errors to cdc.errors.

The converters are checked on the values pyodbc hands over (from either
driver); the connect-error tests open a real ODBC connection with FreeTDS to a
closed loopback port.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import socket
import struct
import uuid
from decimal import Decimal

import pyodbc
import pytest

from cdc.config import SourceConfig
from cdc.errors import (
    ConnectError,
    SchemaError,
    SourceError,
    SourceUnavailable,
    TableChanged,
    TrackingNotEnabled,
    UnsupportedType,
)
from cdc.sources import mssql_types as types
from cdc.sources.mssql import MssqlSource
from cdc.sources.mssql_dsn import describe_dsn, parse_dsn, scrub
from cdc.sources.mssql_errors import connect_error, error_parts, map_error
from cdc.values import encode_value

# -- converters -------------------------------------------------------------------


def dto_bytes(y: int, mo: int, d: int, h: int, mi: int, s: int, ns: int, tzh: int, tzm: int) -> bytes:
    return struct.pack("<6hI2h", y, mo, d, h, mi, s, ns, tzh, tzm)


def test_datetimeoffset_bytes_are_decoded_with_their_offset() -> None:
    value = types.decode_datetimeoffset(dto_bytes(2026, 11, 21, 23, 0, 5, 123456700, 2, 0))
    assert value == dt.datetime(2026, 11, 21, 23, 0, 5, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    west = types.decode_datetimeoffset(dto_bytes(2024, 2, 29, 8, 30, 0, 0, -5, -30))
    assert west is not None and west.utcoffset() == -dt.timedelta(hours=5, minutes=30)
    assert west.isoformat() == "2024-02-29T08:30:00-05:30"
    assert encode_value(value) == b'"2026-11-21T23:00:05.123456+02:00"'
    assert types.decode_datetimeoffset(None) is None


def test_datetimeoffset_text_from_an_old_tds_version_is_parsed_too() -> None:
    value = types.decode_datetimeoffset("2026-11-21 23:00:05.1234567 +02:00")
    assert value == dt.datetime(2026, 11, 21, 23, 0, 5, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))


def test_datetimeoffset_of_an_unexpected_size_is_refused() -> None:
    with pytest.raises(ValueError, match="20 bytes"):
        types.decode_datetimeoffset(b"\x00" * 10)


def test_the_converter_is_registered_on_the_connection_for_sql_type_minus_155() -> None:
    registered: dict[int, object] = {}

    class Conn:
        def add_output_converter(self, sql_type: int, fn: object) -> None:
            registered[sql_type] = fn

    types.register_converters(Conn())
    assert registered == {-155: types.decode_datetimeoffset}


@pytest.mark.parametrize("type_name", ["money", "smallmoney", "decimal", "numeric"])
def test_money_and_decimals_are_lossless_json_strings(type_name: str) -> None:
    convert = types.converter_for("dbo.T", "Price", type_name)
    assert convert(Decimal("12.5000")) == Decimal("12.5000")
    assert encode_value(convert(Decimal("12.5000"))) == b'"12.5000"'
    assert encode_value(convert(Decimal("-922337203685477.5808"))) == b'"-922337203685477.5808"'
    assert convert(1.1) == Decimal("1.1")  # a driver that hands over a float


def test_uniqueidentifier_is_a_lowercase_string() -> None:
    convert = types.converter_for("dbo.T", "Id", "uniqueidentifier")
    upper = "6F9619FF-8B86-D011-B42D-00C04FC964FF"
    assert convert(upper) == upper.lower()
    assert convert(uuid.UUID(upper)) == upper.lower()
    assert convert(uuid.UUID(upper).bytes_le) == upper.lower()
    assert encode_value(convert(upper)) == f'"{upper.lower()}"'.encode()


def test_binary_types_are_base64() -> None:
    for type_name in ("binary", "varbinary", "image", "timestamp"):
        convert = types.converter_for("dbo.T", "B", type_name)
        assert encode_value(convert(bytearray(b"\x00\x01\xff"))) == b'"AAH/"'


def test_real_is_spelled_as_the_float32_it_was() -> None:
    assert types.to_real(1.100000023841858) == 1.1
    assert types.to_real(0.1) == 0.1
    assert types.to_real(struct.unpack("<f", struct.pack("<f", 16777217.0))[0]) == 16777216.0
    assert encode_value(types.to_real(3.4028234663852886e38)) == b"3.4028235e+38"


def test_scalars() -> None:
    assert types.converter_for("dbo.T", "B", "bit")(True) is True
    assert types.converter_for("dbo.T", "N", "bigint")(2**62) == 2**62
    assert encode_value(types.converter_for("dbo.T", "F", "float")(0.1)) == b"0.1"
    for text in ("char", "varchar", "nchar", "nvarchar", "text", "ntext", "xml"):
        assert types.converter_for("dbo.T", "S", text)("héllo <a/>") == "héllo <a/>"


def test_dates_and_times_in_every_form_a_driver_hands_over() -> None:
    """Both drivers return the nvarchar that CONVERT(..., 121) gives as str
    (and FreeTDS below TDS 7.3 date and time columns themselves, in the same
    down-level text); a datetime that a driver made holds microseconds."""
    assert types.to_date("2026-11-21") == dt.date(2026, 11, 21)
    assert types.to_date(dt.datetime(2026, 11, 21, 1, 2)) == dt.date(2026, 11, 21)
    assert types.iso_time("23:59:59.1234567") == "23:59:59.1234567"
    assert types.iso_time(b"23:59:59") == "23:59:59"
    assert types.iso_time(dt.time(23, 59, 59, 123456)) == "23:59:59.123456"
    assert types.iso_datetime("2026-11-21 23:59:59.1234567") == "2026-11-21T23:59:59.1234567"
    assert types.iso_datetime("2026-11-21 23:59:00.000") == "2026-11-21T23:59:00"  # smalldatetime
    assert types.iso_datetime("2026-11-21 23:59:00.997") == "2026-11-21T23:59:00.997000"  # datetime
    assert types.iso_datetime(dt.datetime(2026, 1, 2, 3, 4, 5, 6)) == "2026-01-02T03:04:05.000006"
    assert (
        types.iso_datetimeoffset("2026-11-21 23:00:05.1234567 +02:00") == "2026-11-21T23:00:05.1234567+02:00"
    )
    assert types.iso_datetimeoffset("0001-01-01 00:00:00 -14:00") == "0001-01-01T00:00:00-14:00"
    west = dt.datetime(2024, 2, 29, 8, 30, tzinfo=dt.timezone(-dt.timedelta(hours=5, minutes=30)))
    assert types.iso_datetimeoffset(west) == "2024-02-29T08:30:00-05:30"
    assert encode_value(types.iso_datetime("2026-01-02 03:04:05.0000001")) == b'"2026-01-02T03:04:05.0000001"'
    for bad in ("2026-11-21", "23:59:59.12345678", "yesterday", "2026-11-21 23:59:59 +2"):
        with pytest.raises(ValueError, match="as SQL Server writes it"):
            types.iso_datetimeoffset(bad)


@pytest.mark.parametrize("type_name", ["MyClrType", "Money2"])
def test_clr_user_types_are_refused_with_the_fix(type_name: str) -> None:
    with pytest.raises(UnsupportedType) as caught:
        types.converter_for("dbo.Forecasts", "Anything", type_name, type_name.lower(), assembly=True)
    message = str(caught.value)
    assert message.startswith(f"dbo.Forecasts.Anything: type {type_name} cannot be mirrored: a CLR")
    assert "columns:" in message and "CAST([Anything] AS nvarchar(4000))" in message
    assert isinstance(caught.value, SchemaError)


def test_a_type_cdc_sync_does_not_know_is_refused_with_the_fix() -> None:
    with pytest.raises(UnsupportedType, match=r"dbo\.T\.V: type vector\(3\) cannot be mirrored: .*columns:"):
        types.converter_for("dbo.T", "V", "vector", "vector(3)")


def test_a_sql_variant_primary_key_is_refused_and_a_published_one_is_not() -> None:
    assert types.converter_for("dbo.T", "V", "sql_variant") is types.to_variant
    with pytest.raises(UnsupportedType, match=r"dbo\.T\.V: a primary-key column of type sql_variant .*ALTER"):
        types.converter_for("dbo.T", "V", "sql_variant", key=True)


def test_an_alias_type_is_shown_with_its_declared_name() -> None:
    with pytest.raises(UnsupportedType, match=r"type dbo\.Blob cannot be mirrored"):
        types.converter_for("dbo.T", "C", "MyClr", "dbo.Blob", assembly=True)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("nvarchar", 40, 0, 0), "nvarchar(20)"),
        (("nvarchar", -1, 0, 0), "nvarchar(max)"),
        (("varbinary", -1, 0, 0), "varbinary(max)"),
        (("char", 10, 0, 0), "char(10)"),
        (("decimal", 9, 12, 2), "decimal(12,2)"),
        (("datetime2", 8, 27, 7), "datetime2(7)"),
        (("datetimeoffset", 10, 34, 7), "datetimeoffset(7)"),
        (("int", 4, 10, 0), "int"),
        (("money", 8, 19, 4), "money"),
    ],
)
def test_format_type(args: tuple[str, int, int, int], expected: str) -> None:
    assert types.format_type(*args) == expected


# -- the DSN ------------------------------------------------------------------------

DSN = "DRIVER={ODBC Driver 18 for SQL Server};SERVER=db,1433;DATABASE=CdcDemo;UID=cdc;PWD={pa;ss}}word};Encrypt=yes"


def test_dsn_parsing_and_description_never_show_the_password() -> None:
    fields = parse_dsn(DSN)
    assert fields["PWD"] == "pa;ss}word" and fields["ENCRYPT"] == "yes" and fields["SERVER"] == "db,1433"
    shown = describe_dsn(DSN)
    assert "pa;ss" not in shown and "server=db,1433" in shown and "user=cdc" in shown
    assert scrub("login with pa;ss}word failed; PWD=abc;x", DSN) == "login with *** failed; PWD=***;x"


# -- driver errors --------------------------------------------------------------------


def odbc_error(kind: type[pyodbc.Error], state: str, text: str, native: int) -> pyodbc.Error:
    return kind(state, f"[{state}] [FreeTDS][SQL Server]{text} ({native}) (SQLExecDirectW)")


@pytest.mark.parametrize(
    ("state", "native", "text"),
    [
        ("08S01", 20006, "Write to the server failed"),
        ("08001", 20009, "Unable to connect: Adaptive Server is unavailable or does not exist"),
        ("HYT00", 0, "Query timeout expired"),
        ("HYT01", 0, "Connection timeout expired"),
        ("40001", 1205, "Transaction (Process ID 52) was deadlocked on lock resources with another process"),
        (
            "42000",
            3961,
            "Snapshot isolation transaction failed in database 'CdcDemo' because the object was modified",
        ),
        ("HY000", 40613, "Database 'CdcDemo' on server is not currently available"),
        ("42000", 3956, "Snapshot isolation transaction failed to start: snapshot isolation is pending"),
        ("42000", 3958, "Transaction aborted when accessing versioned row in table 'dbo.T' in database"),
        ("42000", 3966, "Transaction is rolled back when accessing version store: the version was marked"),
        ("42000", 3967, "Insufficient space in tempdb to hold row versions: the version store was shrunk"),
        ("HY000", 976, "The target database, 'CdcDemo', is participating in an availability group"),
        ("HY000", 978, "The target database is in an availability group: application intent read only"),
        ("HY000", 983, "Unable to access availability database 'CdcDemo' because the replica is resolving"),
    ],
)
def test_transient_errors_are_source_unavailable(state: str, native: int, text: str) -> None:
    error = map_error(odbc_error(pyodbc.OperationalError, state, text, native), DSN, "dbo.T")
    assert isinstance(error, SourceUnavailable) and error.exit_code == 1
    assert "dbo.T" in str(error) and text in str(error) and "pa;ss" not in str(error)


@pytest.mark.parametrize(
    ("native", "text", "permission"),
    [
        (
            229,
            "The SELECT permission was denied on the object 'Forecasts', database 'CdcDemo', schema 'dbo'.",
            "SELECT",
        ),
        (
            300,
            "VIEW CHANGE TRACKING permission denied on object 'Forecasts', database 'CdcDemo'.",
            "VIEW CHANGE TRACKING",
        ),
        (5011, "User does not have permission to alter database 'CdcDemo'.", None),
    ],
)
def test_permission_errors_name_the_missing_permission(
    native: int, text: str, permission: str | None
) -> None:
    error = map_error(odbc_error(pyodbc.ProgrammingError, "42000", text, native), DSN)
    assert type(error) is SourceError
    assert "lacks" in str(error)
    if permission:
        assert f"the {permission} permission" in str(error)


def test_other_error_numbers() -> None:
    snapshot = map_error(
        odbc_error(pyodbc.ProgrammingError, "42000", "Snapshot isolation not allowed", 3952), DSN
    )
    assert type(snapshot) is SourceError and "ALLOW_SNAPSHOT_ISOLATION ON" in str(snapshot)
    other = map_error(odbc_error(pyodbc.ProgrammingError, "42000", "Something else went wrong.", 8134), DSN)
    assert type(other) is SourceError and "Something else went wrong" in str(other)


# What a read or snapshot raises when the table changed under it (the texts of sys.messages).
CHANGED_UNDER_A_READ = [
    ("42S22", 207, "Invalid column name 'Status'.", TableChanged, "a column it reads was dropped or renamed"),
    ("42S02", 208, "Invalid object name 'dbo.Forecasts'.", TableChanged, "dropped, or renamed"),
    (
        "42S02",
        4902,
        'Cannot find the object "dbo.Forecasts" because it does not exist or you do not have permissions.',
        TableChanged,
        "dropped, or renamed",
    ),
    (
        "42000",
        22105,
        "Change tracking is not enabled on table 'dbo.Forecasts'.",
        TrackingNotEnabled,
        "`cdc tracking enable --table dbo.Forecasts`",
    ),
    (
        "42000",
        4998,
        "Change tracking is not enabled on table 'dbo.Forecasts'.",
        TrackingNotEnabled,
        "`cdc tracking enable --table dbo.Forecasts`",
    ),
]


@pytest.mark.parametrize(
    ("state", "native", "text", "kind", "why"),
    CHANGED_UNDER_A_READ,
    ids=[str(c[1]) for c in CHANGED_UNDER_A_READ],
)
def test_a_table_changed_under_a_read_is_a_schema_or_tracking_error_of_that_table(
    state: str, native: int, text: str, kind: type[Exception], why: str
) -> None:
    """Never SourceUnavailable (no retrying the same statement) nor a bare
    SourceError: the table is described again, which says what happened."""
    _, natives, _ = error_parts(odbc_error(pyodbc.ProgrammingError, state, text, native))
    assert natives == {native}
    error = map_error(odbc_error(pyodbc.ProgrammingError, state, text, native), DSN, "dbo.Forecasts")
    assert type(error) is kind and error.exit_code == 2
    message = str(error)
    assert message.startswith("dbo.Forecasts: ") and why in message and f"(error {native})" in message
    assert "will be described again" in message and "pa;ss" not in message


def test_a_ddl_conflict_in_a_snapshot_transaction_stays_transient() -> None:
    """3961: the DDL committed after the read's SNAPSHOT transaction began. The
    retry runs in a new transaction, which sees the table as it is now (and
    then fails with 207/208 above, or reads the new shape)."""
    text = (
        "Snapshot isolation transaction failed in database 'CdcDemo' because the object accessed by the "
        "statement has been modified by a DDL statement in another concurrent transaction since the start "
        "of this transaction."
    )
    error = map_error(odbc_error(pyodbc.ProgrammingError, "42000", text, 3961), DSN, "dbo.Forecasts")
    assert isinstance(error, SourceUnavailable)


def test_several_errors_in_one_message_are_all_read() -> None:
    """The Microsoft driver joins the messages of one failed statement."""
    exc = pyodbc.ProgrammingError(
        "42S22",
        "[42S22] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Invalid column name 'Status'. (207) "
        "(SQLExecDirectW); [42S22] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Statement(s) could "
        "not be prepared. (8180)",
    )
    assert error_parts(exc)[1] == {207, 8180}
    assert isinstance(map_error(exc, DSN, "dbo.Forecasts"), SchemaError)


def test_connect_errors_at_start_up_and_when_reconnecting() -> None:
    exc = odbc_error(pyodbc.OperationalError, "28000", "Login failed for user 'cdc'.", 18456)
    startup = connect_error(exc, DSN, at_startup=True)
    assert isinstance(startup, ConnectError) and startup.exit_code == 3 and "Login failed" in str(startup)
    assert isinstance(connect_error(exc, DSN, at_startup=False), SourceUnavailable)
    tls = pyodbc.OperationalError(
        "08001",
        "[08001] [Microsoft][ODBC Driver 18 for SQL Server]SSL Provider: certificate verify failed (-1) (SQLDriverConnect)",
    )
    assert "TrustServerCertificate=yes" in str(connect_error(tls, DSN, at_startup=True))


# -- a real ODBC connection to a closed port ---------------------------------------------

FREETDS_SO = "/usr/lib/x86_64-linux-gnu/odbc/libtdsodbc.so"  # Debian's tdsodbc, named by path
DRIVERS = [
    d
    for d, there in (("{FreeTDS}", "FreeTDS" in pyodbc.drivers()), (FREETDS_SO, os.path.exists(FREETDS_SO)))
    if there
]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.skipif(not DRIVERS, reason="FreeTDS (tdsodbc) is not installed")
@pytest.mark.parametrize("driver", DRIVERS or ["{FreeTDS}"])
async def test_a_closed_port_is_a_connect_error_without_the_password(driver: str) -> None:
    dsn = f"DRIVER={driver};SERVER=127.0.0.1;PORT={closed_port()};DATABASE=CdcDemo;UID=cdc;PWD=Sup3r-S3cret;TDS_Version=7.4"
    source = MssqlSource(SourceConfig(kind="mssql", dsn=dsn, connect_timeout=2))
    with pytest.raises(ConnectError) as caught:
        await asyncio.wait_for(source.connect(), 20)
    message = str(caught.value)
    assert caught.value.exit_code == 3
    assert "Sup3r-S3cret" not in message and "PWD" not in message
    assert "cannot connect to SQL Server" in message and "127.0.0.1" in message
    # the same failure while running is transient: the daemon retries it
    with pytest.raises(SourceUnavailable):
        await asyncio.wait_for(source.current_version(), 20)
    await source.close()


async def test_a_missing_driver_is_a_connect_error_that_says_so() -> None:
    dsn = "DRIVER={ODBC Driver 99 for SQL Server};SERVER=127.0.0.1,1;UID=cdc;PWD=Sup3r-S3cret"
    source = MssqlSource(SourceConfig(kind="mssql", dsn=dsn, connect_timeout=1))
    with pytest.raises(ConnectError, match="not installed") as caught:
        await source.connect()
    assert "Sup3r-S3cret" not in str(caught.value) and caught.value.exit_code == 3
    await source.close()
