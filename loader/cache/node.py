"""The node cache: remote shard bytes kept on local disk, shared by the ranks of one node.

A shard's bytes are cached in aligned blocks of BLOCK bytes (the last one shorter), each a
file named from a hash of (url, version) and the block's byte range, so no URL can name a
path and a rewritten shard (another version) never matches an old block. A read of bytes
[a, b) takes the blocks covering it from disk and fetches the missing ones (consecutive
ones in one request), whole: the reads of a node's ranks and epochs cut shards at
different rows, and aligned blocks are what they share. The block file format and the
claims are in loader.cache.files.

fsspec's own caches (``filecache``, ``blockcache``) do not fit: they key by path, not by
the indexed version; they are per process (a node's ranks would each fetch and hold their
copy), bounded by LRU or not at all, and cannot check what they hand back. So:

- writes are atomic: a block goes to a temporary name, then is renamed, so a killed
  process leaves no half block (its temporary files are removed by the next scan);
- every block read from disk is checked: its size at each read, its trailer and the
  CRC-32 of each 64 KiB piece read the first time the process reads that piece of that
  file (a write in place is another file: `loader.cache.files.read_block`); a damaged one
  is logged (WARNING), deleted and fetched again, never decoded;
- a block being fetched by one process is claimed (an exclusive ``.claim`` file); the
  node's other processes wait for it instead of fetching it too;
- the first cached read of a shard in a reading checks that the remote file is still the
  indexed version (one metadata request), so a shard rewritten on S3 raises
  StaleIndexError as an uncached read does, rather than being served from the old copy;
- with a `limit`, blocks are evicted by next use: the node's plans say when each shard is
  read next (`loader.cache.next_use.NextUse`), the block needed furthest ahead goes first, and
  a block needed later than everything held is not cached (Belady's rule) and is then
  fetched only where read, not whole. The node's processes share the limit: blocks being
  fetched (claimed) count as held, and each process assumes the others wrote as much as
  it did since it last listed the folder. ``policy="lru"`` (least recently read first, for
  comparison) exists for the benchmark and tests.
- only files with the cache's own names are ever deleted, and only inside its folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from shardstream.sampler.checks import parse_size

from ..stats import current
from ..storage.filesystems import Indexed
from ..storage.through import Fetch
from .files import (
    CLAIM_WAIT,
    NAME,
    claim,
    dead_claim,
    file_bytes,
    forget,
    read_block,
    shard_key,
    write_block,
)
from .holdings import Future, Holdings
from .mapped import map_files
from .remote import RemoteChecks

__all__ = ["BLOCK", "NodeCache", "parse_size"]

log = logging.getLogger(__name__)

BLOCK = 1 << 20  # bytes a cached block holds (the unit fetched, kept and evicted)
POLL = 0.01  # seconds between looks at a block another process is fetching


class NodeCache(Holdings):
    """Blocks of remote shards in `folder` (created if missing), at most `limit` bytes of
    them (None: no bound), evicted as `policy` says ("next-use": by `future`; "lru")."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        limit: int | None = None,
        future: Future | None = None,
        policy: str = "next-use",
        sharers: int = 1,
    ) -> None:
        if policy not in ("next-use", "lru"):
            raise ValueError(f"policy must be 'next-use' or 'lru', got {policy!r}")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._dir = str(self.folder)
        self.limit, self.future, self.policy = limit, future, policy
        self.block = BLOCK
        self._lock = threading.Lock()
        self._room = threading.Lock()
        self._pending: dict[str, int] = {}  # blocks being written (their room reserved)
        self._changed: dict[str, int | None] = {}  # written (bytes) or deleted (None) here
        self._held: dict[str, int] = {}  # block file name -> bytes on disk
        self._inflight: dict[str, int] = {}  # blocks others were fetching at the listing
        self._scanned = -float("inf")
        self._remote = RemoteChecks()  # shards checked against the remote, and started
        # the node's processes writing to the folder (eviction makes room for a block each)
        self.sharers = max(1, sharers)

    # --- reading ---------------------------------------------------------------------

    def read(
        self,
        fs: Any,
        urls: Sequence[str],
        starts: Sequence[int],
        ends: Sequence[int],
        indexed: Sequence[Indexed],
        fetch: Fetch,
        shard: int | None = None,
    ) -> list[bytes]:
        """Bytes [starts[i], ends[i]) of urls[i] (of the indexed (size, version)), from the
        cache where it holds them, the missing blocks fetched with `fetch` (the retrying
        ranged read) and kept. `shard`: the shard these reads are for (the plan's id)."""
        if shard is not None and self.future is not None:
            self.future.reached(shard)
        # what each range needs of each block: (range, block name, the block's bytes
        # [lo, hi) of the file, and the part [x, y) of the block wanted)
        needs: list[tuple[int, str, int, int, int, int]] = []
        for i, (a, b) in enumerate(zip(starts, ends)):
            for name, lo, hi in self._blocks(urls[i], indexed[i], a, b):
                needs.append((i, name, lo, hi, max(a, lo) - lo, min(b, hi) - lo))
        parts: dict[int, bytes] = {}  # need -> its bytes, served from disk
        missing: dict[str, tuple[int, int, int]] = {}  # block name -> (range, lo, hi)
        for k, (i, name, lo, hi, x, y) in enumerate(needs):
            data = None if name in missing else self._get(name, x, y)
            if data is None:
                missing.setdefault(name, (i, lo, hi))
            else:
                parts[k] = data
        if parts:
            self._check_remote(fs, {needs[k][0] for k in parts}, urls, indexed)
            current().add("cache_hit_bytes", sum(len(d) for d in parts.values()))
        whole: dict[str, bytes] = {}  # block name -> the whole block
        keep: list[str] = []  # blocks this process fetches whole, to keep
        passed: set[str] = set()  # blocks the policy does not keep: only what is read
        for name in missing:
            if not self._claim(name):
                continue  # another process of the node is fetching it
            data = self._get(name)  # written by another process since it was missing?
            if data is not None:
                self._unclaim(name)
                whole[name] = data
                current().add("cache_hit_bytes", len(data))
            elif self._reserve(name, missing[name][2] - missing[name][1]):
                keep.append(name)
            else:
                self._unclaim(name)
                passed.add(name)
        try:
            whole.update(self._fetch(keep, missing, urls, indexed, fetch))
        finally:
            for name in keep:
                self._unclaim(name)
            with self._lock:  # reservations of blocks a failed fetch never wrote
                unwritten = sum(self._pending.pop(name, 0) for name in keep)
            self._release(unwritten)
        for name in missing:  # fetched by another process of the node: wait for it
            if name not in whole and name not in passed:
                data = self._wait(name)
                if data is not None:
                    whole[name] = data
                    current().add("cache_hit_bytes", len(data))
        # what no block kept holds (not kept, or its fetcher gave up): the bytes read only
        exact = [k for k, n in enumerate(needs) if k not in parts and n[1] not in whole]
        runs: list[list[int]] = []  # consecutive needs of one range: one request
        for k in exact:
            if runs and needs[runs[-1][-1]][0] == needs[k][0] and k == runs[-1][-1] + 1:
                runs[-1].append(k)
            else:
                runs.append([k])
        got = (
            fetch(
                [urls[needs[r[0]][0]] for r in runs],
                [needs[r[0]][2] + needs[r[0]][4] for r in runs],
                [needs[r[-1]][2] + needs[r[-1]][5] for r in runs],
                [indexed[needs[r[0]][0]] for r in runs],
            )
            if runs
            else []
        )
        for run, blob in zip(runs, got):
            at = 0
            for k in run:
                n = needs[k][5] - needs[k][4]
                parts[k] = blob[at : at + n]
                at += n
        out: list[list[bytes]] = [[] for _ in urls]
        for k, (i, name, _, _, x, y) in enumerate(needs):
            out[i].append(parts[k] if k in parts else whole[name][x:y])
        return [p[0] if len(p) == 1 else b"".join(p) for p in out]

    def mapped(self, url: str, indexed: Indexed, end: int) -> pa.Buffer | None:
        """Bytes [0, end) of the shard as one read-only memory map over its block files
        (loader.cache.mapped) if the folder holds every block of them, each intact; None
        otherwise (or with `policy="lru"`, whose recency is each read's touch): read it
        through `read`. A damaged block is logged and deleted, as `read` does."""
        end = min(end, indexed[0])
        if self.policy != "next-use" or end <= 0:
            return None
        blocks, held = self._blocks(url, indexed, 0, end), self.held()
        if any(name not in held for name, _, _ in blocks):
            return None
        paths = [os.path.join(self._dir, name) for name, _, _ in blocks]
        whole, damaged, problem = map_files(paths, [hi - lo for _, lo, hi in blocks], self.block)
        if damaged is not None and problem is not None:
            self._damaged(blocks[damaged][0], problem)
        return None if whole is None else whole.slice(0, end)

    def served(self, shard: int, nbytes: int) -> None:
        """`nbytes` of shard `shard` were read from a `mapped` buffer: counted as hits, and
        the plan told the shard is being read (as `read` does)."""
        if self.future is not None:
            self.future.reached(shard)
        current().add("cache_hit_bytes", nbytes)

    def holds(
        self,
        urls: Sequence[str],
        starts: Sequence[int],
        ends: Sequence[int],
        indexed: Sequence[Indexed],
    ) -> bool:
        """Whether the folder holds (or the node is fetching) every block of bytes
        [starts[i], ends[i]) of urls[i] (of the indexed (size, version)), as listed now:
        a reading of them is then served from here. A block evicted meanwhile is still
        fetched when read."""
        held = self.held(rescan=True)
        return all(
            name in held
            for url, a, b, ix in zip(urls, starts, ends, indexed)
            for name, _, _ in self._blocks(url, ix, a, b)
        )

    def _blocks(self, url: str, indexed: Indexed, a: int, b: int) -> list[tuple[str, int, int]]:
        """(file name, first byte, end byte) of each block holding bytes [a, b) of the
        shard (of the indexed (size, version))."""
        key, size = shard_key(url, indexed[1]), indexed[0]
        his = [(lo, min(lo + self.block, size)) for lo in range(a - a % self.block, b, self.block)]
        return [(f"{key}-{lo}-{hi}.blk", lo, hi) for lo, hi in his]

    def _fetch(
        self,
        names: list[str],
        blocks: dict[str, tuple[int, int, int]],
        urls: Sequence[str],
        indexed: Sequence[Indexed],
        fetch: Fetch,
    ) -> dict[str, bytes]:
        """Fetch the blocks `names` (consecutive blocks of a file in one range) and write
        them (their room is reserved)."""
        if not names:
            return {}
        runs: list[tuple[int, int, int, list[str]]] = []  # (url index, start, end, names)
        for name in names:
            i, lo, hi = blocks[name]
            if runs and runs[-1][0] == i and runs[-1][2] == lo:
                runs[-1] = (i, runs[-1][1], hi, [*runs[-1][3], name])
            else:
                runs.append((i, lo, hi, [name]))
        data = fetch(
            [urls[i] for i, *_ in runs],
            [lo for _, lo, _, _ in runs],
            [hi for _, _, hi, _ in runs],
            [indexed[i] for i, *_ in runs],
        )
        out: dict[str, bytes] = {}
        for (_, lo, _, run), blob in zip(runs, data):
            if len(run) == 1 and len(blob) == blocks[run[0]][2] - blocks[run[0]][1]:
                out[run[0]] = blob
                self._write(run[0], blob)
                continue
            for name in run:
                _, a, b = blocks[name]
                out[name] = blob[a - lo : b - lo]
                self._write(name, out[name])
        return out

    def _check_remote(
        self, fs: Any, which: set[int], urls: Sequence[str], indexed: Sequence[Indexed]
    ) -> None:
        """StaleIndexError if a shard served from the cache is no longer its indexed
        version on the remote (checked once a shard per cache object: one reading). A
        shard whose check was started ahead is not waited for: its reader confirms it
        before handing out its rows (`confirm`)."""
        for i in sorted(which):
            if not self._remote.started(urls[i], indexed[i][1]):
                self._remote.check(fs, urls[i], indexed[i])

    def confirm(self, fs: Any, url: str, indexed: Indexed) -> None:
        """StaleIndexError if the shard is no longer its indexed version on the remote
        (waits for its check, started ahead or made now; nothing once it has passed)."""
        self._remote.check(fs, url, indexed)

    def check_ahead(
        self, fs: Any, urls: Sequence[str], indexed: Sequence[Indexed], shards: int
    ) -> None:
        """Start the checks of these shards against the remote now, at once, rather than
        one round trip each as their first cached reads come; their reads no longer wait
        for them: the reader must `confirm` each shard before handing out its rows.
        `shards`: the index's number of shards (loader.cache.remote)."""
        self._remote.ahead(fs, urls, indexed, shards)

    # --- the files ---------------------------------------------------------------------

    def _get(self, name: str, x: int = 0, y: int | None = None) -> bytes | None:
        """Bytes [x, y) of the block (y None: its end) if the folder holds it intact (see
        `read_block`); a damaged block is logged, deleted and None returned."""
        path = os.path.join(self._dir, name)
        # LRU's recency is the file's mtime, shared by the node
        data, problem = read_block(path, x, y, touch=self.policy == "lru")
        if problem is not None:
            self._damaged(name, problem)
            return None
        return data

    def _damaged(self, name: str, problem: str) -> None:
        """A block file found damaged: logged and deleted (the block is fetched again)."""
        log.warning(
            "cache: %s is damaged (%s): fetching the block again", self.folder / name, problem
        )
        self._delete(name)

    def _put(self, name: str, data: bytes) -> None:
        """Write the block atomically if the policy keeps it."""
        if self._reserve(name, len(data)):
            self._write(name, data)

    def _reserve(self, name: str, size: int) -> bool:
        """Whether the policy keeps a block of `size` data bytes; if so its room is made
        (evicting as the policy says) and reserved until `_write`."""
        need = file_bytes(size)
        with self._room:  # decide and reserve at once: reader threads put concurrently
            if not self._make_room(name, need):
                return False
            with self._lock:
                self._pending[name] = need
        return True

    def _write(self, name: str, data: bytes) -> None:
        """Write a reserved block atomically: a temporary name, then a rename."""
        try:
            write_block(self.folder / name, data)
        except OSError as e:  # a full disk must not fail the read: the bytes are here
            log.warning("cache: cannot write %s (%s): not cached", self.folder / name, e)
            with self._lock:
                unwritten = self._pending.pop(name, 0)
            self._release(unwritten)
            return
        with self._lock:
            size = self._pending.pop(name, 0)
            self._held[name] = self._changed[name] = size

    def _delete(self, name: str, counted: bool = True) -> None:
        """Delete a block file; `counted`: take its bytes off the node's count (eviction,
        which holds the count, sets it itself)."""
        m = NAME.match(name)
        if m is None:  # never a file the cache did not name
            raise AssertionError(f"cache: refusing to delete {name!r}")
        forget(self.folder / name)
        try:
            (self.folder / name).unlink()
        except FileNotFoundError:
            counted = False  # another process deleted it (and counted it)
        with self._lock:
            self._held.pop(name, None)
            self._changed[name] = None
        if counted:
            self._release(file_bytes(int(m.group(3)) - int(m.group(2))))

    def _claim(self, name: str) -> bool:
        """Whether this process now fetches the block (False: another one is)."""
        return claim(self.folder / f"{name}.claim")

    def _unclaim(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.folder / f"{name}.claim").unlink()

    def _wait(self, name: str) -> bytes | None:
        """The block once the process that claimed it has written it; None if it gave up
        (it did not keep the block, or failed) or took longer than CLAIM_WAIT."""
        claim = self.folder / f"{name}.claim"
        deadline = time.monotonic() + CLAIM_WAIT
        while time.monotonic() < deadline:
            data = self._get(name)
            if data is not None or not claim.exists() or dead_claim(claim):
                return data if data is not None else self._get(name)
            time.sleep(POLL)
        return None
