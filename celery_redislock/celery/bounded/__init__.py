"""Bounded concurrency: its options and settings, the permit guard, re-scheduling.

May import the core and the shared glue beside it (config, options, execution, ...); never cli.
"""
