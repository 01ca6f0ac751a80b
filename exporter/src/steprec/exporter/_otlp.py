"""OTLP log records written straight to protobuf bytes, for the few field types steprec sends.

The OpenTelemetry SDK's path (a `LogRecord`, bounded attributes, `encode_logs`
into protobuf objects, then serialising) costs about 90 us per record, and the
protobuf classes alone about 30 us: several times what a whole step may add
to an agent (issue 18). Writing the bytes directly takes a few microseconds,
and the attributes every record of a run shares are written once per run.
The wire is unchanged: plain `ExportLogsServiceRequest`s that any OTLP
receiver parses (tests/test_records.py checks these bytes against the
protobuf classes field by field).

Field numbers are those of opentelemetry-proto's `logs/v1/logs.proto` and
`common/v1/common.proto`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence

_LEN, _VARINT, _I64, _I32 = 2, 0, 1, 5
_FIXED64 = struct.Struct("<Q")
_FIXED32 = struct.Struct("<I")
_DOUBLE = struct.Struct("<d")

AttributeValue = str | bool | int | float | bytes | Sequence["AttributeValue"] | Mapping[str, "AttributeValue"]


_SMALL = [bytes((i,)) for i in range(0x80)]


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


_TAGS = {(field, kind): _tag(field, kind) for field in range(1, 16) for kind in (_LEN, _VARINT, _I64, _I32)}
_STRING, _BOOL, _INT, _KEY, _VALUE = (
    _TAGS[1, _LEN],
    _TAGS[2, _VARINT],
    _TAGS[3, _VARINT],
    _TAGS[1, _LEN],
    _TAGS[2, _LEN],
)
_ATTRIBUTE = _TAGS[6, _LEN]
_keys: dict[str, bytes] = {}
"""Encoded `KeyValue.key` fields: attribute names are a small fixed vocabulary (`steprec.proto.wire`)."""


def length_delimited(field: int, payload: bytes) -> bytes:
    """`payload` as field `field` of a message (a nested message, a string or bytes)."""
    return _TAGS[field, _LEN] + _varint(len(payload)) + payload


def any_value(value: AttributeValue) -> bytes:
    """An `AnyValue` message: string 1, bool 2, int 3, double 4, array 5, kvlist 6, bytes 7."""
    kind = type(value)
    if kind is str:
        encoded = value.encode()
        return _STRING + _varint(len(encoded)) + encoded
    if kind is bool:
        return _BOOL + (b"\x01" if value else b"\x00")
    if kind is int:
        return _INT + _varint(value & 0xFFFFFFFFFFFFFFFF)  # int64: two's complement
    if kind is float:
        return _TAGS[4, _I64] + _DOUBLE.pack(value)
    if kind is bytes:
        return length_delimited(7, value)
    if isinstance(value, Mapping):
        return length_delimited(6, key_values(value, field=1))
    if isinstance(value, (list, tuple)):
        return length_delimited(5, b"".join(length_delimited(1, any_value(item)) for item in value))
    raise TypeError(f"cannot encode {kind.__name__} as an OTLP AnyValue")


def _key_value(key: str, value: AttributeValue) -> bytes:
    if (encoded_key := _keys.get(key)) is None:
        raw = key.encode()
        encoded_key = _KEY + _varint(len(raw)) + raw
        if len(_keys) < 1024:
            _keys[key] = encoded_key
    encoded_value = any_value(value)
    return encoded_key + _VALUE + _varint(len(encoded_value)) + encoded_value


def key_values(values: Mapping[str, AttributeValue], *, field: int) -> bytes:
    """`KeyValue` messages (key 1, value 2), each as repeated field `field` of the enclosing message."""
    return b"".join(length_delimited(field, _key_value(key, value)) for key, value in values.items())


def attribute(key: str, value: AttributeValue) -> bytes:
    """One LogRecord attribute (its field 6), for `log_record`."""
    pair = _key_value(key, value)
    return _ATTRIBUTE + _varint(len(pair)) + pair


_recurring: dict[tuple[str, str | int], bytes] = {}
_RECURRING_MAX = 4096
"""Most attributes of a run's records recur (step indexes, tool names and call ids, statuses, states): one
dict lookup instead of an encoding is most of what building a record saves (issue 18). Bounded; emptied when full."""


def attributes(values: Iterable[tuple[str, AttributeValue | None]]) -> bytes:
    """LogRecord attributes, leaving out None values; string and integer ones are remembered (`_recurring`),
    so pass values unique to one record (an idempotency key) to `attribute` instead."""
    out = []
    for key, value in values:
        if value is None:
            continue
        kind = type(value)
        if kind is not str and kind is not int:  # bool is not int here: True must not find 1's encoding
            out.append(attribute(key, value))
        elif (encoded := _recurring.get((key, value))) is not None:
            out.append(encoded)
        else:
            if len(_recurring) >= _RECURRING_MAX:
                _recurring.clear()
            encoded = _recurring[key, value] = attribute(key, value)
            out.append(encoded)
    return b"".join(out)


def log_record(
    *,
    time_unix_nano: int,
    observed_unix_nano: int,
    severity_number: int,
    event_name: str,
    encoded_attributes: bytes,
    body: bytes,
    trace_id: bytes = b"",
    span_id: bytes = b"",
    trace_flags: int = 0,
) -> bytes:
    """One `LogRecord` message. `body` is an encoded `AnyValue`, `encoded_attributes` from `attributes`."""
    parts = [
        _TAGS[1, _I64] + _FIXED64.pack(time_unix_nano),
        _TAGS[2, _VARINT] + _varint(severity_number),
        length_delimited(5, body),
        encoded_attributes,
    ]
    if trace_id:
        parts += (
            _TAGS[8, _I32] + _FIXED32.pack(trace_flags),
            length_delimited(9, trace_id),
            length_delimited(10, span_id),
        )
    parts += (_TAGS[11, _I64] + _FIXED64.pack(observed_unix_nano), length_delimited(12, event_name.encode()))
    return b"".join(parts)


class RequestEnvelope:
    """Turns encoded LogRecords into one `ExportLogsServiceRequest` under one resource and scope.

    Concatenated requests parse as one request holding all their records in order (protobuf
    merges repeated fields), which is how journal frames are sent many per Export.
    """

    def __init__(self, resource: Mapping[str, AttributeValue], scope_name: str, scope_version: str) -> None:
        self._resource = length_delimited(1, key_values(resource, field=1))
        scope = length_delimited(1, scope_name.encode()) + length_delimited(2, scope_version.encode())
        self._scope = length_delimited(1, scope)

    def request(self, records: Sequence[bytes]) -> bytes:
        scope_logs = self._scope + b"".join(length_delimited(2, record) for record in records)
        return length_delimited(1, self._resource + length_delimited(2, scope_logs))
