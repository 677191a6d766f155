"""The Lua scripts of the core, one file per script plus the libraries they share.

Data only (read by :mod:`..scripts`); imports nothing.
"""
