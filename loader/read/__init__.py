"""Reading plans: a rank's records fetched and decoded ahead, within a memory budget.

Stages, each importing only those below it:
- `plan_reader`: `PlanReader`, records [start, stop) of plans, in parts of a batch;
- `reading`: one pass's read groups: scheduled, read, held, let go (`slabs`: the groups
  a slab touches);
- `decoding`: who decodes each fetched group, and when (`Ahead`);
- `groups`: one read group (`Group`) and what the stages need of the reader;
- `budget`: the bound on bytes held and read ahead.
Beside them: `mixture_rows` (a mixture's streams merged in the schedule's order) and
`amplification` (the warning when a plan fetches far more than its records).
"""

from __future__ import annotations

__all__: list[str] = []  # import names from the modules above
