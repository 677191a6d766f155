"""Singleton tasks: options, the call's key (binding, canonical), enqueue, guard, duplicates.

May import the core and the shared glue beside it (config, options, execution, ...); never cli.
"""
