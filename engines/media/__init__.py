"""Media containers without decoding: encoded packets kept as they came, and written out again."""
