"""Ray Serve deployments, one per module."""

import time

# When a replica's process first imported the platform (Ray loads the deployment's class, whose
# module imports vLLM): the end of start-up phase process_up, the start of imports.
IMPORTED_AT = time.time()
