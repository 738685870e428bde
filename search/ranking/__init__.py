"""Ranking: the legs, fusion, the semantic floor, the mode gate, rerank, budget, augmentation, neighbours, synonyms."""
