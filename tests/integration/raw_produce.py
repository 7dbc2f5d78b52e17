"""Write one record with arbitrary header *bytes* over a hand-built ProduceRequest (v3, record batch v2).

confluent-kafka's producer writes a bytes header key as its `str()` (`b"\\xff"` becomes the text `b'\\xff'`)
and Java's takes a String, so no ordinary client writes a non-UTF-8 header key; any producer speaking the
protocol can, and the broker (Apache Kafka and tansu alike) stores the bytes as they are. Test-only: one
record per request, acks=all, PLAINTEXT, sent to the partition's leader found through the admin client.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Sequence

import pytest

from retrytopics.connectors.config import KafkaConfig
from retrytopics.connectors.kafka import make_admin

_CRC32C_TABLE: list[int] = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC32C_TABLE.append(_c)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)  # zigzag
    out = bytearray()
    while True:
        if z < 0x80:
            out.append(z)
            return bytes(out)
        out.append((z & 0x7F) | 0x80)
        z >>= 7


def _bytes_field(data: bytes | None) -> bytes:
    return _varint(-1) if data is None else _varint(len(data)) + data


def record_batch(key: bytes | None, value: bytes | None, headers: Sequence[tuple[bytes, bytes | None]]) -> bytes:
    """One uncompressed record in a v2 batch at offset delta 0."""
    body = b"\x00" + _varint(0) + _varint(0) + _bytes_field(key) + _bytes_field(value) + _varint(len(headers))
    body += b"".join(_bytes_field(k) + _bytes_field(v) for k, v in headers)
    record = _varint(len(body)) + body
    now = int(time.time() * 1000)
    after_crc = struct.pack(">hiqqqhii", 0, 0, now, now, -1, -1, -1, 1) + record
    after_length = struct.pack(">ibI", -1, 2, crc32c(after_crc)) + after_crc
    return struct.pack(">qi", 0, len(after_length)) + after_length


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def produce_raw_record(
    kafka: KafkaConfig,
    topic: str,
    partition: int,
    *,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[bytes, bytes | None]],
) -> None:
    """Append one record with these exact key, value and header bytes to `topic[partition]`."""
    if str(kafka.security_protocol).upper() != "PLAINTEXT":
        pytest.skip("the hand-built produce request speaks PLAINTEXT only")
    metadata = make_admin(kafka).list_topics(topic, timeout=10)
    leader = metadata.brokers[metadata.topics[topic].partitions[partition].leader]
    produce_raw(f"{leader.host}:{leader.port}", topic, partition, record_batch(key, value, headers))


def produce_raw(address: str, topic: str, partition: int, batch: bytes, *, timeout_s: float = 10.0) -> None:
    """Send `batch` to the broker at `address` (the partition's leader) with acks=all; raise on an error."""
    body = struct.pack(">hhi", -1, -1, int(timeout_s * 1000))  # null transactional id, acks=all, timeout
    body += struct.pack(">i", 1) + _string(topic) + struct.pack(">i", 1)
    body += struct.pack(">ii", partition, len(batch)) + batch
    request = struct.pack(">hhi", 0, 3, 1) + _string("raw-produce") + body
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        size = struct.unpack(">i", _read(sock, 4))[0]
        response = _read(sock, size)
    # correlation id, 1 topic: name, 1 partition: index, error code, ...
    name_length = struct.unpack_from(">h", response, 8)[0]
    error = struct.unpack_from(">h", response, 10 + name_length + 4 + 4)[0]
    if error:
        raise RuntimeError(f"produce to {topic}[{partition}] failed with Kafka error code {error}")


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        data += chunk
    return data
