"""The names under which our steps record counts in datatrove's stats, and the manifest reads them."""

BAD_ROW_STAT = "bad_row_"                 # + reason, by the input reader (reader.py)
REWRITTEN = "rewritten_documents"         # by a line-rewriting filter (filters.C4Lines)
CHARS_REMOVED = "rewrite_removed_chars"
TOO_LONG_TO_COUNT = "documents_too_long_to_count"  # by the token counter (steps.BoundedTokensCounter)
