"""What the API records about its own work: metrics, retrieval statistics, the access audit, ops figures."""
