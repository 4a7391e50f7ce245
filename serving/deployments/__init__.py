"""Ray Serve deployments, one per module."""
