"""`python -m draftgen.status RUN_DIR [--json]`."""

import sys

from draftgen.status.render import main

sys.exit(main())
