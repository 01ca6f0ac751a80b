"""Storage, in the order a record travels: validation against run state and staging (the write path),
the write-ahead log, the applier into DuckDB, the reads, and prune."""
