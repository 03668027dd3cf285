"""The names under which the steps record counts (datatrove's stats) and metadata that the manifest reads."""

BAD_ROW_STAT = "bad_row_"                 # + reason, by the input reader (reader.py)
REWRITTEN = "rewritten_documents"         # by a line-rewriting filter (filters.C4Lines)
CHARS_REMOVED = "rewrite_removed_chars"
TOO_LONG_TO_COUNT = "documents_too_long_to_count"  # by the token counter (steps.BoundedTokensCounter)
CLUSTER_ID = "minhash_cluster_id"         # datatrove's metadata key (MinhashDedupFilter, load_cluster_ids)
KEPT_COPY = "kept_copy"                   # ours, in a removed duplicate's sample: the id its group kept
EXACT_HASH = "exact_dedup_hash"           # ours, in a removed exact duplicate's sample: its group's content hash
