"""Fourth floor: an Iceberg REST catalog whose commits the oracle orders. Uses oracle/ and store/.

Every commit (one table, several tables, or DDL) takes a write timestamp W from the oracle, lands
in one database transaction that also raises the catalog's upper to W, and is acknowledged only
after `apply_write(W)`. New snapshots are stamped W, so any engine's time travel at a T from
`read_ts()` is one consistent, repeatable cut across tables (docs/iceberg.md).
"""
