"""PySpark pipeline: reads the archived broker events (Parquet) and writes outputs for the console."""
