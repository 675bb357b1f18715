"""Storage: reading bytes of shard files, local or remote, and nothing above that.

- `filesystems`: URLs plus storage_options opened through fsspec (local, s3fs, HTTP, ...),
  one instance a store shared by all threads, sizes and versions, ranged reads
  (`cat_ranges`), credentials redacted in errors.
- `listing`: the files under a directory, prefix or glob, with sizes and versions.
- `ranged_get`: ranged GETs over HTTP stores, each answer checked against what was asked.
- `retry`: bounded, jittered retries of reads (`RetryPolicy`, `read_ranges`).
- `ranges`: fetched byte ranges as a file a decoder reads, never filled in.
- `through`: which byte cache a thread's reads go through (the node cache is handed in).
- `s3`: s3fs's filesystem with its retries made an option.
- `gcs`, `azure`: gcsfs's and adlfs's filesystems with bounded tries and timeouts,
  and their checked ranged reads of the indexed version.
- `store_errors`: the stores' errors as ours (credentials, statuses worth a retry).

Imports point down only: storage imports no other subpackage of `loader`.
"""

from __future__ import annotations

__all__: list[str] = []  # import names from the modules above
