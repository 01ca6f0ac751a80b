"""Lake mode: the recorder's tables in one DuckLake (catalog in PostgreSQL or a file, Parquet on S3 or a folder)."""
