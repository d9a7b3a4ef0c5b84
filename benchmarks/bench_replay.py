"""Replay: read and decode one large session (default 200,000 realistic events).

Cases (each repeated, median reported):

- ``raw cursor``: plain ``lmdb`` and ``msgspec``: one read transaction, a cursor over
  the session's values, each block unpacked into its records (see
  :mod:`storage.lmdb.layout`), no event decoding (the floor for anything that reads the log).
- ``codec.decode only``: the records already in memory, decoded one by one.
- ``store.read``: :meth:`Store.read` of the whole session (short read transactions
  of 4,096 records, contiguity checks, decoding).
- ``store.open_session``: :meth:`Store.open_session` (read, decode, and rebuild the
  session's projections).

Peak RSS of a fresh process that opens the store read-only and reads the session is
measured in a subprocess.

Run: ``python benchmarks/bench_replay.py [--events 200000] [--repeats 5] [--json PATH]``
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import msgspec
from _common import median, parser, print_table, rss_of, write_json
from bench_log_append import realistic_facts

from storage import Store

SESSION = "replay"


def build(path: Path, events: int) -> None:
    with Store.open(path, map_size=512 << 20, durability="none") as store:
        session = store.create_session(SESSION)
        for kind, data in realistic_facts(events):
            session.append(kind, data)
        store.flush()


def raw_values(path: Path) -> list[bytes]:
    env = lmdb.open(str(path), subdir=True, max_dbs=8, readonly=True)
    unpack = msgspec.msgpack.Decoder(list[bytes]).decode
    try:
        with env.begin(db=env.open_db(b"events", create=False)) as txn:
            records: list[bytes] = []
            for value in txn.cursor().iternext(keys=False):  # one session: all of events
                if value[:1] < b"\x80":
                    records.append(value)  # one record per value (stores before version 3)
                else:
                    records += unpack(value)
            return records
    finally:
        env.close()


def measure(fn: Callable[[], object], repeats: int) -> list[float]:
    seconds = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - start)
        del result
    return seconds


def main() -> None:
    args_parser = parser(__doc__.splitlines()[0], repeats=5)
    args_parser.add_argument("--events", type=int, default=200_000)
    args = args_parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="corral-replay-", dir="/tmp"))
    path = root / "store"
    results: dict[str, Any] = {}
    rows = []
    try:
        build(path, args.events)
        payloads = raw_values(path)
        seconds = measure(lambda: raw_values(path), args.repeats)  # before the store opens it
        rate = args.events / median(seconds)
        results["raw cursor"] = {"events": args.events, "seconds": seconds, "events_per_s": rate}
        rows.append(["raw cursor (plain lmdb, no decode)", args.events, median(seconds), rate])
        with Store.open(path, readonly=True) as store:
            assert store.stats(SESSION).event_count == args.events
            decode = store.codec.decode
            cases: list[tuple[str, Callable[[], object]]] = [
                ("codec.decode only", lambda: [decode(p, session_id=SESSION) for p in payloads]),
                ("store.read (read + decode)", lambda: store.read(SESSION)),
                ("store.open_session (+ projections)", lambda: store.open_session(SESSION)),
            ]
            for name, fn in cases:
                seconds = measure(fn, args.repeats)
                rate = args.events / median(seconds)
                results[name] = {"events": args.events, "seconds": seconds, "events_per_s": rate}
                rows.append([name, args.events, median(seconds), rate])
        probe = (
            "from storage import Store\n"
            f"store = Store.open({str(path)!r}, readonly=True)\n"
            f"events = store.read({SESSION!r})\n"
        )
        rss = rss_of(probe)["max_rss"]
        results["reader_max_rss_bytes"] = rss
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(["case", "events", "median s", "events/s"], rows)
    print(f"peak RSS of a process reading all {args.events:,} events: {rss / 2**20:,.0f} MiB")
    write_json(args.json, "replay", results)


if __name__ == "__main__":
    main()
