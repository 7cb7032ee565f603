"""``python -m trainkit.checkpoint inspect|verify|export ...``."""

import sys

from trainkit.checkpoint._cli import main

sys.exit(main())
