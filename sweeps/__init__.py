"""The shipped sweep files (``rmq-sim sweep NAME`` finds them here by name)."""
