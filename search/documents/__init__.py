"""Documents, their relations and decision records, read for a caller."""
