"""A PostgreSQL type zoo: a column per type and edge value, with the JSON text
docs/TYPES.md says the document holds for it; and the values that go to the
dead letter instead, with the words their reason holds.

``{s}`` in a type or literal is the test's schema (quoted).
"""

from __future__ import annotations

from dataclasses import dataclass

DEEP = 1000  # nesting levels of the deep JSON values


@dataclass(frozen=True)
class Case:
    type: str  # the column's SQL type
    literal: str  # an SQL expression of the value
    json: bytes  # the document field's text


# Types the zoo's columns use, made in the test's schema first.
SETUP = (
    "create type {s}.mood as enum ('sad', 'ok', 'happy')",
    "create domain {s}.price as numeric(8,2) check (value >= 0)",
    "create domain {s}.ints as int[]",
    "create domain {s}.stamp as timestamp",
    "create type {s}.address as (street text, n int, since date)",
    "create type {s}.floatrange as range (subtype = float8)",
)

PI = b'{"pi": 3.141592653589793238462643383279, "d": 12345678901234567.89, "e": 1e400, "big": 123456789012345678901}'

ZOO: dict[str, Case] = {
    # -- numbers: JSON numbers, exact; numeric and money strings
    "c_int2": Case("smallint", "-32768", b"-32768"),
    "c_int4": Case("integer", "2147483647", b"2147483647"),
    "c_int8_max": Case("bigint", "9223372036854775807", b"9223372036854775807"),
    "c_int8_min": Case("bigint", "-9223372036854775808", b"-9223372036854775808"),
    "c_int8_2_53": Case("bigint", "9007199254740993", b"9007199254740993"),
    "c_numeric": Case(
        "numeric",
        "'12345678901234567890.123456789012345678901234567890'",
        b'"12345678901234567890.123456789012345678901234567890"',
    ),
    "c_numeric_scale": Case("numeric(10,2)", "1.5", b'"1.50"'),
    "c_numeric_tiny": Case("numeric", "'1e-20'", b'"0.00000000000000000001"'),
    "c_numeric_nan": Case("numeric", "'NaN'", b'"NaN"'),
    "c_numeric_inf": Case("numeric", "'Infinity'", b'"Infinity"'),
    "c_numeric_ninf": Case("numeric", "'-Infinity'", b'"-Infinity"'),
    "c_real": Case("real", "'3.4028235e38'", b"3.4028235e+38"),
    "c_real_small": Case("real", "'1e-45'", b"1e-45"),
    "c_real_tenth": Case("real", "'0.1'", b"0.1"),
    "c_double_max": Case("double precision", "'1.7976931348623157e308'", b"1.7976931348623157e+308"),
    "c_double_min": Case("double precision", "'5e-324'", b"5e-324"),
    "c_double_neg0": Case("double precision", "'-0'", b"-0.0"),
    "c_money": Case("money", "'-92233720368547758.08'", b'"-92233720368547758.08"'),
    "c_money_max": Case("money", "'92233720368547758.07'", b'"92233720368547758.07"'),
    "c_oid": Case("oid", "4294967295", b"4294967295"),
    "c_xid8": Case("xid8", "'18446744073709551615'", b"18446744073709551615"),
    "c_xid": Case("xid", "'4294967295'", b"4294967295"),
    "c_cid": Case("cid", "'7'", b"7"),
    "c_bool": Case("boolean", "false", b"false"),
    # -- text and bytes
    "c_text": Case(
        "text", "E'h\\u00e9llo \"w\\u00f6rld\"\\n\\t\\\\'", '"héllo \\"wörld\\"\\n\\t\\\\"'.encode()
    ),
    "c_text_emoji": Case("text", "E'\\U0001F389'", '"🎉"'.encode()),
    "c_varchar": Case("varchar(10)", "'abc'", b'"abc"'),
    "c_char": Case("char(4)", "'ab'", b'"ab  "'),
    "c_name": Case("name", "'pg_class'", b'"pg_class"'),
    "c_qchar": Case('"char"', "'x'", b'"x"'),
    "c_bytea": Case("bytea", "'\\x00ff10'::bytea", b'"AP8Q"'),
    "c_bytea_empty": Case("bytea", "''::bytea", b'""'),
    "c_uuid": Case(
        "uuid", "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'", b'"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"'
    ),
    # -- dates and times: ISO 8601; what Python cannot hold too
    "c_date": Case("date", "'2024-02-29'", b'"2024-02-29"'),
    "c_date_first": Case("date", "'0001-01-01'", b'"0001-01-01"'),
    "c_date_last4": Case("date", "'9999-12-31'", b'"9999-12-31"'),
    "c_date_inf": Case("date", "'infinity'", b'"infinity"'),
    "c_date_ninf": Case("date", "'-infinity'", b'"-infinity"'),
    "c_date_bc": Case("date", "'0044-03-15 BC'", b'"-0043-03-15"'),
    "c_date_1bc": Case("date", "'0001-12-31 BC'", b'"0000-12-31"'),
    "c_date_min": Case("date", "'4713-01-01 BC'", b'"-4712-01-01"'),
    "c_date_10k": Case("date", "'10000-01-01'", b'"+10000-01-01"'),
    "c_date_max": Case("date", "'5874897-12-31'", b'"+5874897-12-31"'),
    "c_ts": Case("timestamp", "'2024-02-29 13:45:30.5'", b'"2024-02-29T13:45:30.500000"'),
    "c_ts_inf": Case("timestamp", "'infinity'", b'"infinity"'),
    "c_ts_bc": Case("timestamp", "'0044-03-15 10:00:00.123 BC'", b'"-0043-03-15T10:00:00.123000"'),
    "c_ts_max": Case("timestamp", "'294276-12-31 23:59:59.999999'", b'"+294276-12-31T23:59:59.999999"'),
    "c_ts_min": Case("timestamp", "'4713-01-01 00:00:00 BC'", b'"-4712-01-01T00:00:00"'),
    "c_tstz": Case("timestamptz", "'2024-02-29 13:45:30+02'", b'"2024-02-29T11:45:30+00:00"'),
    "c_tstz_ninf": Case("timestamptz", "'-infinity'", b'"-infinity"'),
    "c_tstz_10k": Case("timestamptz", "'10000-01-01 00:00:00+00'", b'"+10000-01-01T00:00:00+00:00"'),
    "c_tstz_bc": Case("timestamptz", "'0044-03-15 10:00:00.5+00 BC'", b'"-0043-03-15T10:00:00.500000+00:00"'),
    "c_time": Case("time", "'13:45:30.125'", b'"13:45:30.125000"'),
    "c_time_24": Case("time", "'24:00:00'", b'"24:00:00"'),
    "c_timetz": Case("timetz", "'08:30:00+05:30'", b'"08:30:00+05:30"'),
    "c_timetz_24": Case("timetz", "'24:00:00-05'", b'"24:00:00-05:00"'),
    "c_timetz_secs": Case("timetz", "'08:30:00+05:30:15'", b'"08:30:00+05:30:15"'),
    "c_interval": Case("interval", "'1 year 2 months 3 days 04:05:06.5'", b'"P1Y2M3DT4H5M6.5S"'),
    "c_interval_neg": Case("interval", "'1 mon -1 day -00:00:01'", b'"P1M-1DT-1S"'),
    "c_interval_zero": Case("interval", "'0'", b'"PT0S"'),
    "c_interval_big": Case("interval", "'178000000 years'", b'"P178000000Y"'),
    # -- JSON: the server's own text, never parsed
    "c_json": Case("json", f"'{PI.decode()}'", PI),
    "c_json_spaced": Case("json", "E' {\"a\" :\\n [1, 2.50] } '", b' {"a" :\n [1, 2.50] } '),
    "c_json_dupes": Case("json", '\'{"a": 1, "a": 2}\'', b'{"a": 1, "a": 2}'),
    "c_json_null": Case("json", "'null'", b"null"),
    "c_json_deep": Case(
        "json", f"(repeat('[', {DEEP}) || repeat(']', {DEEP}))::json", b"[" * DEEP + b"]" * DEEP
    ),
    "c_jsonb": Case(
        "jsonb",
        f"'{PI.decode()}'",
        b'{"d": 12345678901234567.89, "e": 1' + b"0" * 400 + b', "pi": 3.141592653589793238462643383279, '
        b'"big": 123456789012345678901}',
    ),
    "c_jsonb_order": Case(
        "jsonb", '\'{"bb": 1, "a": {"c": [true, 2.50]}}\'', b'{"a": {"c": [true, 2.50]}, "bb": 1}'
    ),
    "c_jsonb_str": Case("jsonb", "'\"\\ud83c\\udf89\"'", '"🎉"'.encode()),
    "c_jsonb_deep": Case(
        "jsonb", f"(repeat('[', {DEEP}) || repeat(']', {DEEP}))::jsonb", b"[" * DEEP + b"]" * DEEP
    ),
    "c_json_array": Case(
        "json[]", "array['{\"a\": 1.10}'::json, null, '1e400']", b'[{"a": 1.10},null,1e400]'
    ),
    "c_jsonb_array": Case("jsonb[]", "array['{\"a\": 1.10}'::jsonb]", b'[{"a": 1.10}]'),
    # -- the server's text, as a string
    "c_inet": Case("inet", "'192.168.1.5'", b'"192.168.1.5"'),
    "c_inet_net": Case("inet", "'192.168.1.5/24'", b'"192.168.1.5/24"'),
    "c_inet6": Case("inet", "'::ffff:1.2.3.4/120'", b'"::ffff:1.2.3.4/120"'),
    "c_cidr": Case("cidr", "'10.0.0.0/8'", b'"10.0.0.0/8"'),
    "c_macaddr": Case("macaddr", "'08-00-2B-01-02-03'", b'"08:00:2b:01:02:03"'),
    "c_macaddr8": Case("macaddr8", "'08:00:2b:01:02:03:04:05'", b'"08:00:2b:01:02:03:04:05"'),
    "c_int4range": Case("int4range", "'[1,10]'", b'"[1,11)"'),
    "c_int4range_empty": Case("int4range", "'empty'", b'"empty"'),
    "c_int8range": Case("int8range", "'(,9223372036854775807)'", b'"(,9223372036854775807)"'),
    "c_numrange": Case("numrange", "'(1.50,2.5]'", b'"(1.50,2.5]"'),
    "c_tsrange": Case(
        "tsrange",
        "'[2024-01-01 10:00,2024-02-01)'",
        b'"[\\"2024-01-01 10:00:00\\",\\"2024-02-01 00:00:00\\")"',
    ),
    "c_tstzrange": Case(
        "tstzrange", "'[2024-01-01 00:00+02,infinity)'", b'"[\\"2023-12-31 22:00:00+00\\",infinity)"'
    ),
    "c_daterange": Case("daterange", "'[2024-01-01,2024-01-31]'", b'"[2024-01-01,2024-02-01)"'),
    "c_int4multirange": Case("int4multirange", "'{[1,3), [5,7)}'", b'"{[1,3),[5,7)}"'),
    "c_datemultirange": Case("datemultirange", "'{}'", b'"{}"'),
    "c_floatrange": Case("{s}.floatrange", "'[1.5,2.5)'", b'"[1.5,2.5)"'),
    "c_point": Case("point", "'(1.5,-2)'", b'"(1.5,-2)"'),
    "c_line": Case("line", "'{1,-1,0}'", b'"{1,-1,0}"'),
    "c_lseg": Case("lseg", "'[(0,0),(1,1)]'", b'"[(0,0),(1,1)]"'),
    "c_box": Case("box", "'(0,0),(1,1)'", b'"(1,1),(0,0)"'),
    "c_path": Case("path", "'[(0,0),(1,1),(2,0)]'", b'"[(0,0),(1,1),(2,0)]"'),
    "c_polygon": Case("polygon", "'((0,0),(1,1),(2,0))'", b'"((0,0),(1,1),(2,0))"'),
    "c_circle": Case("circle", "'<(0,0),1.5>'", b'"<(0,0),1.5>"'),
    "c_point_exact": Case("point", "point(0.1, 1e300)", b'"(0.1,1e+300)"'),
    "c_bit": Case("bit(4)", "B'1010'", b'"1010"'),
    "c_varbit": Case("bit varying", "B'101'", b'"101"'),
    "c_tsvector": Case("tsvector", "'a fat cat:3A'", b"\"'a' 'cat':3A 'fat'\""),
    "c_tsquery": Case("tsquery", "'fat & (cat | dog)'", b"\"'fat' & ( 'cat' | 'dog' )\""),
    "c_xml": Case("xml", "'<a b=\"1\">x &amp; y</a>'", b'"<a b=\\"1\\">x &amp; y</a>"'),
    "c_pg_lsn": Case("pg_lsn", "'16/B374D848'", b'"16/B374D848"'),
    "c_tid": Case("tid", "'(0,1)'", b'"(0,1)"'),
    "c_txid_snapshot": Case("txid_snapshot", "'10:20:10,14,15'", b'"10:20:10,14,15"'),
    "c_jsonpath": Case("jsonpath", "'$.a[*] ? (@ > 1)'", b'"$.\\"a\\"[*]?(@ > 1)"'),
    "c_enum": Case("{s}.mood", "'happy'", b'"happy"'),
    "c_address": Case(
        "{s}.address",
        "row('1 Main St, \"A\"', 7, 'infinity')",
        b'"(\\"1 Main St, \\"\\"A\\"\\"\\",7,infinity)"',  # the record's text: quotes doubled
    ),
    "c_domain": Case("{s}.price", "1.5", b'"1.50"'),
    "c_domain_array": Case("{s}.ints", "'{1,2}'", b"[1,2]"),
    # -- arrays: JSON arrays of their elements' encodings
    "c_int_2d": Case("integer[]", "'{{1,2},{3,NULL}}'", b"[[1,2],[3,null]]"),
    "c_int_empty": Case("integer[]", "'{}'", b"[]"),
    "c_text_array": Case("text[]", r"""'{"a,b","c\"d",NULL,"NULL",""}'""", b'["a,b","c\\"d",null,"NULL",""]'),
    "c_uuid_array": Case(
        "uuid[]",
        "'{A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11,NULL}'",
        b'["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",null]',
    ),
    "c_numeric_array": Case("numeric[]", "'{1.10,NaN,-Infinity}'", b'["1.10","NaN","-Infinity"]'),
    "c_bool_array": Case("boolean[]", "'{t,f,NULL}'", b"[true,false,null]"),
    "c_bytea_array": Case("bytea[]", "array['\\x00ff'::bytea]", b'["AP8="]'),
    "c_date_array": Case(
        "date[]", "'{infinity,0044-03-15 BC,2024-01-01}'", b'["infinity","-0043-03-15","2024-01-01"]'
    ),
    "c_time_array": Case("time[]", "'{24:00:00,08:00}'", b'["24:00:00","08:00:00"]'),
    "c_tstz_array": Case(
        "timestamptz[]", "'{2024-01-01 00:00+01,infinity}'", b'["2023-12-31T23:00:00+00:00","infinity"]'
    ),
    "c_interval_array": Case("interval[]", "'{1 day,-1 mon}'", b'["P1D","P-1M"]'),
    "c_money_array": Case("money[]", "'{1.5,-2}'", b'["1.50","-2.00"]'),
    "c_inet_array": Case("inet[]", "'{10.0.0.1,::1/128}'", b'["10.0.0.1","::1"]'),
    "c_range_array": Case("int4range[]", "'{\"[1,2)\",empty}'", b'["[1,2)","empty"]'),
    "c_box_array": Case("box[]", "'{(1,1),(0,0);(3,3),(2,2)}'", b'["(1,1),(0,0)","(3,3),(2,2)"]'),
    "c_point_array": Case("point[]", "'{\"(1,2)\",NULL}'", b'["(1,2)",null]'),
    "c_enum_array": Case("{s}.mood[]", "'{sad,happy,NULL}'", b'["sad","happy",null]'),
    "c_domain_elements": Case("{s}.price[]", "'{1.5,2}'", b'["1.50","2.00"]'),
    "c_stamp_elements": Case(
        "{s}.stamp[]", "'{infinity,2024-01-01 10:00}'", b'["infinity","2024-01-01T10:00:00"]'
    ),
    "c_address_array": Case("{s}.address[]", "array[row('x', 1, null)::{s}.address]", b'["(x,1,)"]'),
    "c_varbit_array": Case("bit varying[]", "'{1,0101}'", b'["1","0101"]'),
    "c_char_array": Case('"char"[]', "'{a,b}'", b'["a","b"]'),
}

# The zoo's second row: every column NULL, every field null.
NULLS: dict[str, str] = dict.fromkeys(ZOO, "null")

# Extension types, where the extension can be created.
EXTENSIONS = ("hstore", "citext")
EXTENSION_ZOO: dict[str, Case] = {
    "c_hstore": Case(
        "{s}.hstore", r"""'a=>1, b=>NULL, "c d"=>"x\"y"'""", b'{"a":"1","b":null,"c d":"x\\"y"}'
    ),
    "c_hstore_array": Case("{s}.hstore[]", "array['k=>v'::{s}.hstore]", b'[{"k":"v"}]'),
    "c_citext": Case("{s}.citext", "'MiXeD'", b'"MiXeD"'),
    "c_citext_array": Case("{s}.citext[]", "'{A,b}'", b'["A","b"]'),
}


@dataclass(frozen=True)
class DeadCase:
    type: str
    literal: str
    reason: str  # words the dead letter's reason holds


# Values with no JSON spelling: each row goes to the dead letter, naming its column.
DEAD: dict[str, DeadCase] = {
    "nan": DeadCase("double precision", "'NaN'", "nan cannot be represented in JSON"),
    "inf": DeadCase("double precision", "'Infinity'", "inf cannot be represented in JSON"),
    "ninf": DeadCase("double precision", "'-Infinity'", "-inf cannot be represented in JSON"),
    "real_nan": DeadCase("real", "'NaN'", "nan cannot be represented in JSON"),
    "nan_array": DeadCase("double precision[]", "'{1,NaN}'", "nan cannot be represented in JSON"),
    "bounds": DeadCase("integer[]", "'[0:1]={1,2}'", "does not start at index 1"),
    "lone": DeadCase("json", '\'{"k": "\\ud800"}\'', "half a UTF-16 surrogate pair (\\ud800)"),
}


def quoted(text: str, schema: str) -> str:
    return text.replace("{s}", f'"{schema}"')
