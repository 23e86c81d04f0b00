import sys

from tsoracle_dev.rck.cli import main

sys.exit(main())
