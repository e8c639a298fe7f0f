"""The frozen-encoder feature cache and its files (content keys, shards, crashed writers' leftovers)."""
