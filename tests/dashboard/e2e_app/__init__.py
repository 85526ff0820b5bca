"""Tasks for the console's browser tests, installed only by ``tests.dashboard.e2e_settings``.

The names tests need live here, so a test can import them without importing
the tasks (which only register under the e2e settings).
"""

GATEWAY_DOWN = "console-e2e:gateway-down"
"""While this Redis key exists, ``charge`` fails like a payment gateway that is down."""
QUEUE = "payments"
