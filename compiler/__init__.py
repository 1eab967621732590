"""nextn."""
