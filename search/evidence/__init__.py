"""What the service hands to agents as evidence: pure checks over document text (no I/O), such as the
prompt-injection detector in `injection.py` that flags or redacts passages written as instructions to a model."""
