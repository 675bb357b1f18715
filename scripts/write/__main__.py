"""``python -m shardstream.write SOURCE DEST ...``: the ``shardstream-write`` command."""

import sys

from .cli import main

sys.exit(main())
