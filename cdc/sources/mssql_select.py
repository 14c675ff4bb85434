"""How each published SQL Server column is selected, so that its value arrives exact.

Most columns are selected as they are. Some the ODBC drivers cannot hand over
exactly, or at all, are selected as a text or bytes the server writes, which
``mssql_types`` reads back (it lists each type with its JSON):

- dates and times with a time part, as ``CONVERT(nvarchar(40), x, 121)``:
  pyodbc cuts a driver's nanoseconds to Python's microseconds, so a
  datetime2(7), time(7) or datetimeoffset(7) value would lose its 7th digit.
  Style 121, "ODBC canonical (with milliseconds)", is the default for time,
  date, datetime2 and datetimeoffset and writes every fractional digit of the
  value's scale, ``yyyy-mm-dd hh:mi:ss[.nnnnnnn] [+hh:mi]`` ("CAST and CONVERT
  (Transact-SQL)", "datetime2 (Transact-SQL)": 19 to 27 characters,
  learn.microsoft.com); a style fixes the format whatever the session's
  DATEFORMAT or LANGUAGE. datetime and smalldatetime too, so that no driver's
  rounding of their 1/300 s decides their text;
- xml, hierarchyid, geometry, geography: cast (``_AS_TEXT``);
- sql_variant: its base type and its value's text (``variant_text``): "ODBC
  does not fully support sql_variant" ("sql_variant (Transact-SQL)");
- char, varchar, text: cast to nvarchar of the same length. A varchar's bytes
  reach the client in the driver's client character set, which FreeTDS takes
  from freetds.conf or LANG and else makes ISO 8859-1 ("Localization and TDS
  7.0", FreeTDS User Guide): Cyrillic, Greek or CJK text in a varchar, or a
  _UTF8 collation's characters, would arrive as '?' without an error. As
  nvarchar the server converts it, from the column's own code page, to
  UTF-16, which every driver hands over exactly. n bytes of a varchar(n) are
  at most n UTF-16 code units (a 4-byte UTF-8 character is 2 of them).

Every expression here is parsed by sqlglot's T-SQL dialect in
tests/cdc/sources/test_mssql_select.py.
"""

from __future__ import annotations

# Types with a time part: read as the server's text, to 100 ns (date has none).
DATE_TIME_TEXT = frozenset({"datetime2", "datetimeoffset", "time", "datetime", "smalldatetime"})


def exact_text(expression: str) -> str:
    """The server's exact text of a date/time value (style 121, above)."""
    return f"CONVERT(nvarchar(40), {expression}, 121)"


_AS_TEXT = {
    "xml": "nvarchar(max)",  # the driver-independent text of the document
    # ToString(): "CAST(node AS nvarchar(4000)) ... implicitly calls ToString()"
    # ("ToString (Database Engine)", learn.microsoft.com); ODBC has no hierarchyid type
    "hierarchyid": "nvarchar(4000)",
    # the serialized value ("[MS-SSCLRT]"); ODBC hands CLR types over as SQL_SS_UDT, which pyodbc cannot read
    "geometry": "varbinary(max)",
    "geography": "varbinary(max)",
}


_CHARACTER = frozenset({"char", "varchar", "text"})
_NVARCHAR_MAX_LENGTH = 4000  # nvarchar(n) takes n up to 4000, else max


def column_select(expression: str, column_type: str | None) -> str:
    """The select expression of a column of declared type ``column_type``
    (``varchar(50)``, or its system type alone): dates and times as the
    server's own text (100 ns), character types as nvarchar, the types of
    ``_AS_TEXT`` cast, a sql_variant as ``variant_text``."""
    base, _, length = (column_type or "").lower().partition("(")
    if base in _CHARACTER:
        size = length.rstrip(")")
        wide = size if size.isdigit() and int(size) <= _NVARCHAR_MAX_LENGTH else "max"
        return f"CAST({expression} AS nvarchar({wide}))"
    if base in DATE_TIME_TEXT:
        return exact_text(expression)
    cast = _AS_TEXT.get(base)
    if cast is not None:
        return f"CAST({expression} AS {cast})"
    if base == "sql_variant":
        return variant_text(expression)
    return expression


# A sql_variant's value as "<base type>:<text>", the text written the way its
# base type reads back exactly (CAST and CONVERT (Transact-SQL), learn.microsoft.com):
# float and real in style 3 ("Always 17 digits. Use for lossless conversion";
# SQL Server 2016 and later), money in style 2 (four decimals, no commas),
# binary in style 1 ("0x" and two hex digits a byte), date and time types in
# style 121 at their widest scale (a narrower value widens exactly), and the
# other base types SQL_VARIANT_PROPERTY lists (integers, bit, decimal,
# character types, uniqueidentifier) in their one string form. The variant is
# cast to its base type first, so that the style is the one of that type (a
# variant "must first be cast to its base data type value" to take part in
# operations: "sql_variant (Transact-SQL)"). NULL stays NULL (CONCAT would
# make it ':').
_VARIANT_STYLES = (
    ("float", "float", 3),
    ("real", "real", 3),
    ("money", "money", 2),
    ("smallmoney", "money", 2),
    ("binary", "varbinary(8000)", 1),
    ("varbinary", "varbinary(8000)", 1),
    ("datetime2", "datetime2(7)", 121),
    ("datetime", "datetime", 121),
    ("smalldatetime", "smalldatetime", 121),
    ("time", "time(7)", 121),
    ("datetimeoffset", "datetimeoffset(7)", 121),
    ("date", "date", 23),
)


def variant_text(expression: str) -> str:
    base = f"CAST(SQL_VARIANT_PROPERTY({expression}, 'BaseType') AS nvarchar(128))"
    cases = " ".join(
        f"WHEN N'{name}' THEN CONVERT(nvarchar(max), CAST({expression} AS {cast}), {style})"
        for name, cast, style in _VARIANT_STYLES
    )
    value = f"CASE {base} {cases} ELSE CAST({expression} AS nvarchar(max)) END"
    return f"CASE WHEN {expression} IS NULL THEN NULL ELSE CONCAT({base}, N':', {value}) END"
