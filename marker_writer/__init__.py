"""Marker writer: delivers COMMIT/ABORT markers to transaction participants (not built yet)."""
