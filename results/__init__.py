"""kparity results: Arrow schemas and the Parquet result store."""
