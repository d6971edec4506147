"""`python -m draftgen.testing.fake_engine`: see `draftgen.testing.fake_engine.cli`."""

import sys

from draftgen.testing.fake_engine.cli import main

sys.exit(main())
