"""`kaiyuan serve`: a batching generation engine and its HTTP API."""
