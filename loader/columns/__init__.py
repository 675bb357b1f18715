"""Arrow columns to batches: decided once from the schema, applied per batch.

- `kinds`: what each column of a batch is (tensor or list, dtype, shape, pad, nulls).
- `gather`: read groups of rows as columns that batches are gathered from.
- `placement`: where each row of a batch comes from, applied to every column alike.
- `batching`: Arrow tables to tensors (`Batch`), and batches regrouped to a size.
- `arrays`, `arrow_numpy`: numpy <-> Arrow without copies or pyarrow's pandas shim.
- `views`: Arrow's view types as the offsets types they stand for (batches gather with
  kernels that have none).
"""

from __future__ import annotations

__all__: list[str] = []  # import names from the modules above
