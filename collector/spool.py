"""The spool's files and the raw batches they hold: what ``collector.writer`` writes before an
insert and reads back after a crash or an outage.

In:  batches (``{"table", "token", "columns"}``: columns as lists / numpy arrays, or ``Raw``
     bytes ClickHouse parses) and the chunks ``Writer.add`` queued.
Out: ``Raw`` (its pieces never joined in memory: the spool file and the insert take them as they
     are), ``combine`` (a table's chunks as one batch), ``pieces`` / ``write_atomic`` (a spool
     file: a short header, a pickle of the batches, then the large buffers — raw pieces, numpy
     columns — as they are, out of the pickle (protocol 5), written whole or not at all),
     ``read_spool_file`` (this format, or the plain pickle of older versions; buffers come back
     as views of the file read once), ``rows`` and ``chunks`` (a raw batch's pieces for an
     insert).
"""

from __future__ import annotations

import os
import pickle
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FRESH_MAX_BYTES", "Raw", "chunks", "combine", "pieces", "read_spool_file", "rows", "size", "write_atomic"]


@dataclass(frozen=True)
class Raw:
    """Rows in a format ClickHouse parses (``fmt``, with its ``settings``): ``data`` is the
    bytes as the format reads them, one piece or several read one after the other (chunks simply
    concatenated, never joined in memory: the spool and the insert take the pieces as they
    are), ``rows`` how many rows they make (for batching and the metrics)."""

    data: bytes | tuple[Any, ...]  # bytes, or pieces (bytes, or views of a spool file read back)
    rows: int
    fmt: str
    settings: tuple[tuple[str, str], ...] = ()
    sizes: tuple[int, ...] = ()  # the chunks in ``data`` (bytes each), to split a refused batch
    counts: tuple[int, ...] = ()  # and their rows

    def pieces(self) -> tuple[Any, ...]:
        return (self.data,) if isinstance(self.data, bytes) else self.data

    def joined(self) -> bytes:
        return self.data if isinstance(self.data, bytes) else b"".join(self.data)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # the pieces travel out of the pickle (protocol 5 buffers): the spool writes them as they are
        data: Any = self.data
        if isinstance(protocol, int) and protocol >= 5:
            data = tuple(pickle.PickleBuffer(piece) for piece in self.pieces())
        return _raw, (data, self.rows, self.fmt, self.settings, self.sizes, self.counts)


def _raw(data: Any, *rest: Any) -> Raw:
    if isinstance(data, tuple):  # pieces: views of the spool file read back, kept as they are
        return Raw(data[0] if len(data) == 1 and isinstance(data[0], bytes) else data, *rest)
    return Raw(data if isinstance(data, bytes) else bytes(data), *rest)


def chunks(parts: tuple[Any, ...]) -> Iterator[bytes]:
    """The pieces for an insert, one after the other: bytes as they are, a view of a spool file
    read back as bytes (an HTTP client sends bytes)."""
    for piece in parts:
        yield piece if isinstance(piece, bytes) else bytes(piece)


def rows(columns: dict[str, Any] | Raw) -> int:
    if isinstance(columns, Raw):
        return columns.rows
    return len(next(iter(columns.values()))) if columns else 0


_MAGIC = b"FSSPOOL2"  # files before it are one plain pickle (read as such)
FRESH_MAX_BYTES = 256 * 1024 * 1024  # just-spooled batches kept in memory for their insert, at most


def pieces(obj: Any) -> list[Any]:
    """``obj`` as a spool file's pieces: magic, pickle and buffer lengths, the pickle, the buffers."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    sizes = struct.pack(f"<QI{len(raws)}Q", len(head), len(raws), *(r.nbytes for r in raws))
    return [_MAGIC, sizes, head, *raws]


def read_spool_file(path: Path) -> Any:
    """A spool file's object (this format or the plain pickle of older versions)."""
    with open(path, "rb") as fh:
        blob = bytearray(os.fstat(fh.fileno()).st_size)  # writable: numpy columns stay views of it
        fh.readinto(blob)
    if not blob.startswith(_MAGIC):
        return pickle.loads(blob)
    view = memoryview(blob)
    at = len(_MAGIC)
    head, count = struct.unpack_from("<QI", view, at)
    at += 12
    sizes = struct.unpack_from(f"<{count}Q", view, at)
    at += 8 * count
    pickled, at = view[at : at + head], at + head
    buffers = []
    for size in sizes:
        buffers.append(view[at : at + size])
        at += size
    return pickle.loads(pickled, buffers=buffers)


def size(parts: list[Any]) -> int:
    return sum(memoryview(p).nbytes for p in parts)


def write_atomic(path: Path, payload: bytes | list[Any]) -> None:
    """Write ``path`` (bytes, or pieces written as one) so that it exists whole or not at all
    (temp file, fsync, rename)."""
    tmp = path.with_suffix(".tmp")
    parts = [payload] if isinstance(payload, bytes) else payload
    try:
        with open(tmp, "wb") as fh:
            for piece in parts:
                fh.write(piece)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def combine(queued: list[Any]) -> Any:
    """One batch from the chunks ``Writer.add`` queued for a table: lists stay lists; a column that
    came as numpy arrays in any chunk becomes one array (of that array's dtype). ``Raw`` chunks
    become one ``Raw`` of all their pieces, in order (not joined)."""
    if isinstance(queued[0], Raw):
        first = queued[0]
        if len(queued) == 1 and isinstance(first.data, bytes):
            return first
        return Raw(
            tuple(chain.from_iterable(c.pieces() for c in queued)),  # not joined: copied once, by whoever writes
            sum(c.rows for c in queued),
            first.fmt,
            first.settings,
            tuple(chain.from_iterable(c.sizes for c in queued)),
            tuple(chain.from_iterable(c.counts for c in queued)),
        )
    if len(queued) == 1:
        return queued[0]
    out: dict[str, Any] = {}
    for name in queued[0]:
        parts = [chunk[name] for chunk in queued]
        arrays = [p for p in parts if isinstance(p, np.ndarray)]
        if not arrays:
            out[name] = list(chain.from_iterable(parts))
        else:
            dtype = arrays[0].dtype
            out[name] = np.concatenate([p if isinstance(p, np.ndarray) else np.asarray(p, dtype=dtype) for p in parts])
    return out
