"""Model and hardware catalogues, with name resolution (docs/design.md §1, §7)."""
