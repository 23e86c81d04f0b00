"""`python -m tsoracle.kubectl`: the plugin without the console script."""

import sys

from tsoracle.kubectl import main

sys.exit(main())
