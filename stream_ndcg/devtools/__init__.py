"""Developer tooling, not the service: local servers (`dev up/down`), the demo, the simulator and a producer.

Nothing in the service package imports from here; tests, the bench and the CLI's
developer commands do.
"""
