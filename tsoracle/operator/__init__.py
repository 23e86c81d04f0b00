"""Fourth floor: the kopf operator for TimestampOracle resources. Uses oracle/.

`kopf run -m tsoracle.operator` imports this package, which registers the handlers.
"""

from tsoracle.operator import handlers  # noqa: F401  (registers the kopf handlers)
