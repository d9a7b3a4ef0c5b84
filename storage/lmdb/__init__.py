"""The LMDB log: its on-disk layout, the environment (open, migration, reads), the log
writer's commit loop, journal compaction and flush waiters, and the store over them.

The names other packages use are exported by :mod:`storage`; these modules are its
implementation (``storage.lmdb.store.Store`` is ``storage.Store``).
"""
