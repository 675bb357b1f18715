"""``python -m shardstream.plan SOURCE ...``: the ``shardstream-plan`` command."""

import sys

from .cli import main

sys.exit(main())
