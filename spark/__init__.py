"""Spark audit jobs over the replicated logs (not built yet)."""
