import sys

from trainkit.cli import main

sys.exit(main())
