"""Model and hardware catalogues (shared FACTS.md), with name resolution."""
